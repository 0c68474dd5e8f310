// torch ops opbridge::ms_deform_attn and opbridge::ms_deform_attn_backward on CUDA tensors, on the
// stable ABI, queued on torch's current stream (schemas, fake kernels and autograd are registered
// with the CPU implementation).
//
// spatial_shapes and level_start_index are validated and passed to the kernels by value, so
// their values are needed on the host: CPU tensors are read directly (the call never
// synchronizes and can be captured in a CUDA graph); CUDA tensors are copied to the host in one
// device-to-host copy, which waits for the current stream.
#include <torch/csrc/stable/accelerator.h>

#include <string>

#include "ms_deform_attn.cuh"
#include "opbridge/ms_deform_attn.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::ms_deform_attn";
constexpr const char* kBackwardOp = "opbridge::ms_deform_attn_backward";

MsDeformAttnArg arg(const Tensor& t, const char* type) {
  const auto s = t.sizes();
  return {s.data(), static_cast<int64_t>(s.size()), type};
}

// Checked sizes and the level table on the host (spatial shapes [L, 2], start indices [L]).
struct Prepared {
  MsDeformAttnDims d;
  Tensor shapes, starts;  // CPU int64, contiguous
};

Prepared prepare(const TorchCall& c, const char* op) {
  const Tensor& value = c.in("value");
  check_value(value.is_cuda(), op, "value must be a CUDA tensor, got " + device_string(value));
  Prepared p{{}, c.host("spatial_shapes"), c.host("level_start_index")};
  const char* vt = elem_type_name(c.call().in("value").type);
  check_status(ms_deform_attn_check(arg(value, vt), arg(c.in("spatial_shapes"), "int64"),
                                    arg(c.in("level_start_index"), "int64"), arg(c.in("sampling_locations"), vt),
                                    arg(c.in("attention_weights"), vt), ptr<int64_t>(p.shapes), ptr<int64_t>(p.starts),
                                    nullptr, &p.d),
               op);
  return p;
}

void check_launch(cudaError_t err, const char* op) {
  if (err != cudaSuccess) {
    throw_error(nullptr, op, std::string("CUDA launch failed: ") + cudaGetErrorName(err) + " (" +
                                 cudaGetErrorString(err) + ")");
  }
}

void ms_deform_attn_cuda_impl(TorchCall& c) {
  const Prepared p = prepare(c, kOp);
  const MsDeformAttnDims& d = p.d;
  const Tensor& value = c.in("value");
  const torch::stable::accelerator::DeviceGuard device_guard(value.get_device_index());
  const Tensor v = contiguous(value), loc = contiguous(c.in("sampling_locations")),
               attn = contiguous(c.in("attention_weights"));
  Tensor out = empty({d.N, d.Lq, d.M * d.D}, dtype(value), value);
  const auto stream = static_cast<cudaStream_t>(current_cuda_stream(value));
  dispatch_float(dtype(value), kOp, [&](auto tag) {
    using T = decltype(tag);
    check_launch(cuda::launch_ms_deform_attn<T>(stream, ptr<T>(v), ptr<int64_t>(p.shapes), ptr<int64_t>(p.starts),
                                                ptr<T>(loc), ptr<T>(attn), mutable_ptr<T>(out), d),
                 kOp);
  });
  c.set_output(0, std::move(out));
}

// The backward's arguments after grad_output are the forward's: checked by its declaration.
void ms_deform_attn_backward_cuda_impl(StableIValue* stack, uint64_t num_args, uint64_t /*num_outputs*/) {
  const Tensor grad_output = BoxedArgs(stack, num_args).tensor(0);
  const TorchCall c(ms_deform_attn_decl(), kBackwardOp, stack + 1, num_args - 1);
  const Prepared p = prepare(c, kBackwardOp);
  const MsDeformAttnDims& d = p.d;
  const Tensor& value = c.in("value");
  check_type(dtype(grad_output) == dtype(value), kBackwardOp,
             std::string("grad_output must have the dtype of value (") + dtype_name(dtype(value)) + "), got " +
                 dtype_name(dtype(grad_output)));
  check_value(same_device(grad_output, value), kBackwardOp,
              "grad_output must be on value's device (" + device_string(value) + "), got " + device_string(grad_output));
  check_value(grad_output.dim() == 3 && grad_output.size(0) == d.N && grad_output.size(1) == d.Lq &&
                  grad_output.size(2) == d.M * d.D,
              kBackwardOp,
              "grad_output must have the output's shape (N, Lq, M * D) = (" + std::to_string(d.N) + ", " +
                  std::to_string(d.Lq) + ", " + std::to_string(d.M * d.D) + "), got " + shape_string(grad_output));
  const torch::stable::accelerator::DeviceGuard device_guard(value.get_device_index());
  const Tensor go = contiguous(grad_output), v = contiguous(value), loc = contiguous(c.in("sampling_locations")),
               attn = contiguous(c.in("attention_weights"));
  Tensor grad_value = empty_like(v), grad_loc = empty_like(loc), grad_attn = empty_like(attn);
  const auto stream = static_cast<cudaStream_t>(current_cuda_stream(value));
  dispatch_float(dtype(value), kBackwardOp, [&](auto tag) {
    using T = decltype(tag);
    // The 16-bit types accumulate grad_value in a float workspace: from torch's caching
    // allocator, released to it (for this stream) once the kernels are queued.
    const size_t ws_bytes = cuda::ms_deform_attn_backward_workspace_bytes<T>(d);
    Tensor ws = ws_bytes > 0 ? empty({static_cast<int64_t>(ws_bytes)}, ScalarType::Byte, value) : undefined_tensor();
    check_launch(cuda::launch_ms_deform_attn_backward<T>(
                     stream, ptr<T>(go), ptr<T>(v), ptr<int64_t>(p.shapes), ptr<int64_t>(p.starts), ptr<T>(loc),
                     ptr<T>(attn), mutable_ptr<T>(grad_value), mutable_ptr<T>(grad_loc), mutable_ptr<T>(grad_attn), d,
                     ws_bytes > 0 ? ws.data_ptr() : nullptr, ws_bytes),
                 kBackwardOp);
  });
  BoxedArgs::set(stack, 0, grad_value);
  BoxedArgs::set(stack, 1, grad_loc);
  BoxedArgs::set(stack, 2, grad_attn);
}

const char* opbridge_namespace() { return "opbridge"; }

}  // namespace

// The library's namespace spelled out (this file is also syntax-checked on its own, without
// opbridge_add_op's OPBRIDGE_TORCH_NAMESPACE).
STABLE_TORCH_LIBRARY_IMPL(opbridge, CUDA, m) {
  m.impl("ms_deform_attn", &declared_kernel<&ms_deform_attn_decl, &ms_deform_attn_cuda_impl, &opbridge_namespace>);
  m.impl("ms_deform_attn_backward", &ms_deform_attn_backward_cuda_impl);
}

}  // namespace opbridge::torch_adapter
