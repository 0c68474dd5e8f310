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

#include "ms_deform_attn.cuh"
#include "opbridge/ms_deform_attn.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::ms_deform_attn";
constexpr const char* kBackwardOp = "opbridge::ms_deform_attn_backward";

// Checked sizes and the level table on the host (spatial shapes [L, 2], start indices [L]).
struct Prepared {
  MsDeformAttnDims d;
  std::vector<at::Tensor> host;  // CPU int64 copies of spatial_shapes and level_start_index
  const int64_t* shapes() const { return host[0].const_data_ptr<int64_t>(); }
  const int64_t* starts() const { return host[1].const_data_ptr<int64_t>(); }
};

Prepared prepare(const at::Tensor& value, const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
                 const at::Tensor& sampling_locations, const at::Tensor& attention_weights, const char* op) {
  // The declaration's checks; spatial_shapes / level_start_index are host_memory inputs: a CUDA
  // tensor is copied to the host once (ordered after the current stream's work), a CPU one is used
  // as it is.
  CheckedCall c = check_call(ms_deform_attn_decl(), op,
                             {value, spatial_shapes, level_start_index, sampling_locations, attention_weights});
  TORCH_CHECK_VALUE(value.is_cuda(), op, ": value must be a CUDA tensor, got ", value.device());
  Prepared p;
  p.host = std::move(c.host);
  const auto a = [](const at::Tensor& t, const char* type) {
    return MsDeformAttnArg{t.sizes().data(), t.dim(), type};
  };
  const char* vt = elem_type_name(c.call.in("value").type);
  check_status(ms_deform_attn_check(a(value, vt), a(spatial_shapes, "int64"), a(level_start_index, "int64"),
                                    a(sampling_locations, vt), a(attention_weights, vt), p.shapes(), p.starts(),
                                    nullptr, &p.d),
               op);
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
  TORCH_CHECK_TYPE(grad_output.scalar_type() == value.scalar_type(), kBackwardOp,
                   ": grad_output must have the dtype of value (", value.scalar_type(), "), got ",
                   grad_output.scalar_type());
  TORCH_CHECK_VALUE(grad_output.device() == value.device(), kBackwardOp, ": grad_output must be on value's device (",
                    value.device(), "), got ", grad_output.device());
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
