// ORT CUDA op ai.opbridge::MultiScaleDeformableAttention for the CUDAExecutionProvider, queued on
// ORT's compute stream. Types, checks and shape inference come from the declaration
// (cpp/ops/ms_deform_attn/ms_deform_attn_decl.cpp): spatial_shapes and level_start_index are
// host_memory() inputs, so ORT keeps or copies them on the host (OrtMemTypeCPUInput): validating
// them and handing them to the kernels by value needs no device-to-host copy and no
// synchronization here.
#include <string>

#include "ms_deform_attn.cuh"
#include "opbridge/ms_deform_attn.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

void ms_deform_attn_cuda_compute(const OrtOpContext& ctx) {
  const Input &value = ctx.inputs[0], &shapes = ctx.inputs[1], &starts = ctx.inputs[2], &loc = ctx.inputs[3],
              &weights = ctx.inputs[4];
  MsDeformAttnDims d;
  const auto a = [](const Input& in) { return MsDeformAttnArg{in.shape.data(), in.rank(), type_name(in.type)}; };
  // Already validated (check_call); this call only fills the sizes.
  ctx.check(ms_deform_attn_check(a(value), a(shapes), a(starts), a(loc), a(weights), shapes.as<int64_t>(),
                                 starts.as<int64_t>(), nullptr, &d));
  void* out = ctx.output(0);
  if (d.N == 0 || d.Lq == 0 || d.M == 0 || d.D == 0) return;
  dispatch_elem(value.type, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t err = cuda::launch_ms_deform_attn<T>(
        static_cast<cudaStream_t>(ctx.io.gpu_stream()), value.as<T>(), shapes.as<int64_t>(), starts.as<int64_t>(),
        loc.as<T>(), weights.as<T>(), static_cast<T*>(out), d);
    if (err != cudaSuccess) {
      fail(ORT_RUNTIME_EXCEPTION,
           ctx.label + ": CUDA launch failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
    }
  });
}

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_ORT_OP(opbridge::ms_deform_attn_decl, "CUDAExecutionProvider", opbridge::ort::ms_deform_attn_cuda_compute);
