// ORT CUDA op ai.opbridge::GroupNorm for the CUDAExecutionProvider: the declaration
// (cpp/ops/group_norm/group_norm_decl.cpp) gives the types, attributes, checks and shapes, as for
// the CPU op; this file queues the kernel on ORT's compute stream. ONNX tensors are NCHW.
#include <string>

#include "group_norm.cuh"
#include "opbridge/group_norm.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

void group_norm_cuda_compute(const OrtOpContext& ctx) {
  const Input& x = ctx.inputs[0];
  const Input& scale = ctx.inputs[1];
  const Input& bias = ctx.inputs[2];
  void* y = ctx.output(0);
  const GroupNormDims d = group_norm_dims(x.shape, ctx.call.attr_int("num_groups"));
  if (d.S == 0) return;
  const Activation act = activation_from_name(ctx.call.attr_string("activation"));
  dispatch_elem(x.type, [&](auto tag) {
    using T = decltype(tag);
    // Scratch in x's (device) memory, from the CUDA EP's allocator.
    const size_t ws_bytes = cuda::group_norm_workspace_bytes<T>(d);
    const Scratch workspace = ctx.io.scratch(ws_bytes, 0);
    const cudaError_t err = cuda::launch_group_norm<T>(
        static_cast<cudaStream_t>(ctx.io.gpu_stream()), x.as<T>(), scale.present ? scale.as<T>() : nullptr,
        bias.present ? bias.as<T>() : nullptr, static_cast<T*>(y), d, ctx.call.attr_float("eps"), act,
        workspace.get(), ws_bytes);
    if (err != cudaSuccess) {
      fail(ORT_RUNTIME_EXCEPTION,
           ctx.label + ": CUDA launch failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
    }
  });
}

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_ORT_OP(opbridge::group_norm_decl, "CUDAExecutionProvider", opbridge::ort::group_norm_cuda_compute);
