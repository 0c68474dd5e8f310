// torch ops opbridge::ms_deform_attn and opbridge::ms_deform_attn_backward on CUDA tensors,
// queued on torch's current stream (schemas, fake kernels and autograd are registered with the
// CPU implementation).
//
// spatial_shapes and level_start_index are validated and passed to the kernels by value, so
// their values are needed on the host: CPU tensors are read directly (the call never
// synchronizes and can be captured in a CUDA graph); CUDA tensors are copied to the host in one
// device-to-host copy, which waits for the current stream.
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "../../common/adapter_checks.h"
#include "ms_deform_attn.cuh"
#include "opbridge/ms_deform_attn.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::ms_deform_attn";
constexpr const char* kBackwardOp = "opbridge::ms_deform_attn_backward";

void check_same(const at::Tensor& t, const at::Tensor& value, const char* op, const char* arg) {
  TORCH_CHECK_TYPE(t.scalar_type() == value.scalar_type(), op, ": ", arg, " must have value's dtype (",
                   value.scalar_type(), "), got ", t.scalar_type(),
                   " (opbridge.ops.ms_deform_attn computes mixed precision in float32)");
  TORCH_CHECK_VALUE(t.device() == value.device(), op, ": ", arg, " must be on value's device (", value.device(),
                    "), got ", t.device());
}

void check_index(const at::Tensor& t, const at::Tensor& value, const char* op, const char* arg) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong, op, ": ", arg, " must be an int64 tensor, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device().is_cpu() || t.device() == value.device(), op, ": ", arg,
                    " must be on the CPU or on value's device (", value.device(), "), got ", t.device());
}

// Checked sizes and the level table on the host: [L, 2] spatial shapes then [L] start indices.
struct Prepared {
  MsDeformAttnDims d;
  at::Tensor table;  // CPU int64, 3 * L elements
  const int64_t* shapes() const { return table.const_data_ptr<int64_t>(); }
  const int64_t* starts() const { return shapes() + 2 * d.L; }
};

Prepared prepare(const at::Tensor& value, const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
                 const at::Tensor& sampling_locations, const at::Tensor& attention_weights, const char* op) {
  check_float_dtype(value, op, "value");
  TORCH_CHECK_VALUE(value.is_cuda(), op, ": value must be a CUDA tensor, got ", value.device());
  check_same(sampling_locations, value, op, "sampling_locations");
  check_same(attention_weights, value, op, "attention_weights");
  check_index(spatial_shapes, value, op, "spatial_shapes");
  check_index(level_start_index, value, op, "level_start_index");
  Prepared p;
  // Shapes first: the level table is read only once they are known to be valid.
  check_status(cuda_checks::ms_deform_attn_check_shapes(
                   value.sizes().data(), value.dim(), spatial_shapes.sizes().data(), spatial_shapes.dim(),
                   level_start_index.sizes().data(), level_start_index.dim(), sampling_locations.sizes().data(),
                   sampling_locations.dim(), attention_weights.sizes().data(), attention_weights.dim(), &p.d),
               op);
  if (spatial_shapes.is_cpu() && level_start_index.is_cpu()) {
    p.table = at::cat({spatial_shapes.reshape({-1}), level_start_index.reshape({-1})});
  } else {
    // One device-to-host copy for both (ordered after the current stream's work).
    p.table = at::cat({spatial_shapes.reshape({-1}).to(value.device()), level_start_index.reshape({-1}).to(value.device())})
                  .cpu();
  }
  check_status(cuda_checks::ms_deform_attn_check_levels(p.d, p.shapes(), p.starts()), op);
  return p;
}

void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
              ")");
}

at::Tensor ms_deform_attn_cuda_impl(const at::Tensor& value, const at::Tensor& spatial_shapes,
                                    const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                                    const at::Tensor& attention_weights) {
  const Prepared p = prepare(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, kOp);
  const MsDeformAttnDims& d = p.d;
  const c10::cuda::CUDAGuard device_guard(value.device());
  const at::Tensor v = value.contiguous(), loc = sampling_locations.contiguous(), attn = attention_weights.contiguous();
  at::Tensor out = at::empty({d.N, d.Lq, d.M * d.D}, value.options());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(value.device().index()).stream();
  dispatch_float(value.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    check_launch(cuda::launch_ms_deform_attn<T>(stream, ptr<T>(v), p.shapes(), p.starts(), ptr<T>(loc), ptr<T>(attn),
                                                mutable_ptr<T>(out), d),
                 kOp);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ms_deform_attn_backward_cuda_impl(
    const at::Tensor& grad_output, const at::Tensor& value, const at::Tensor& spatial_shapes,
    const at::Tensor& level_start_index, const at::Tensor& sampling_locations, const at::Tensor& attention_weights) {
  const Prepared p =
      prepare(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, kBackwardOp);
  const MsDeformAttnDims& d = p.d;
  check_same(grad_output, value, kBackwardOp, "grad_output");
  TORCH_CHECK_VALUE(grad_output.dim() == 3 && grad_output.size(0) == d.N && grad_output.size(1) == d.Lq &&
                        grad_output.size(2) == d.M * d.D,
                    kBackwardOp, ": grad_output must have the output's shape (N, Lq, M * D) = (", d.N, ", ", d.Lq,
                    ", ", d.M * d.D, "), got ", grad_output.sizes());
  const c10::cuda::CUDAGuard device_guard(value.device());
  const at::Tensor go = grad_output.contiguous(), v = value.contiguous(), loc = sampling_locations.contiguous(),
                   attn = attention_weights.contiguous();
  at::Tensor grad_value = at::empty(v.sizes(), value.options());
  at::Tensor grad_loc = at::empty(loc.sizes(), value.options());
  at::Tensor grad_attn = at::empty(attn.sizes(), value.options());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(value.device().index()).stream();
  dispatch_float(value.scalar_type(), kBackwardOp, [&](auto tag) {
    using T = decltype(tag);
    // The 16-bit types accumulate grad_value in a float workspace: from torch's caching
    // allocator, released to it (for this stream) once the kernels are queued.
    const size_t ws_bytes = cuda::ms_deform_attn_backward_workspace_bytes<T>(d);
    at::Tensor ws;
    if (ws_bytes > 0) ws = at::empty({static_cast<int64_t>(ws_bytes)}, value.options().dtype(at::kByte));
    check_launch(cuda::launch_ms_deform_attn_backward<T>(
                     stream, ptr<T>(go), ptr<T>(v), p.shapes(), p.starts(), ptr<T>(loc), ptr<T>(attn),
                     mutable_ptr<T>(grad_value), mutable_ptr<T>(grad_loc), mutable_ptr<T>(grad_attn), d,
                     ws_bytes > 0 ? ws.mutable_data_ptr() : nullptr, ws_bytes),
                 kBackwardOp);
  });
  return {grad_value, grad_loc, grad_attn};
}

}  // namespace

TORCH_LIBRARY_IMPL(opbridge, CUDA, m) {
  m.impl("ms_deform_attn", &ms_deform_attn_cuda_impl);
  m.impl("ms_deform_attn_backward", &ms_deform_attn_backward_cuda_impl);
}

}  // namespace opbridge::torch_adapter
