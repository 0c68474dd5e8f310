// ORT CUDA op ai.opbridge::Inverse for the CUDAExecutionProvider (declaration, checks and shapes as
// for the CPU op: cpp/ops/inverse/inverse_decl.cpp), queued on ORT's compute stream.
//
// Attribute on_singular (since op version 2): "raise" (default): a singular matrix is an error, as
// on the CPU: the kernel reports it in an 8-byte device word that is read back after the launch,
// which synchronizes ORT's compute stream once per call (torch.linalg.inv synchronizes for its
// error check the same way). "nan": a singular matrix's output is all NaN, nothing is read back
// and nothing synchronizes.
#include <string>
#include <vector>

#include "inverse.cuh"
#include "opbridge/inverse.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

void check_cuda(cudaError_t err, const std::string& label, const char* what) {
  if (err != cudaSuccess) {
    fail(ORT_RUNTIME_EXCEPTION,
         label + ": " + what + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}

template <class T>
void launch(const OrtOpContext& ctx, const Input& x, void* out, const InverseDims& d, bool nan_on_singular) {
  // One scratch block from the CUDA EP's allocator: the 8-byte report, then the workspace.
  constexpr size_t kInfoBytes = 16;  // keeps the workspace 16-byte aligned
  const size_t ws_bytes = cuda::inverse_workspace_bytes<T>(d.batch, d.n);
  const Scratch scratch = ctx.io.scratch(kInfoBytes + ws_bytes, 0);
  auto* info = static_cast<uint64_t*>(scratch.get());
  void* ws = ws_bytes > 0 ? static_cast<char*>(scratch.get()) + kInfoBytes : nullptr;
  const auto stream = static_cast<cudaStream_t>(ctx.io.gpu_stream());
  check_cuda(cuda::launch_inverse<T>(stream, x.as<T>(), static_cast<T*>(out), d.batch, d.n, info, ws, ws_bytes,
                                     nan_on_singular),
             ctx.label, "CUDA launch");
  if (nan_on_singular) return;  // nothing to read back: no synchronization
  uint64_t report = cuda::kInverseInfoOk;
  check_cuda(cudaMemcpyAsync(&report, info, sizeof report, cudaMemcpyDeviceToHost, stream), ctx.label,
             "reading the singular-matrix report");
  check_cuda(cudaStreamSynchronize(stream), ctx.label, "synchronizing the compute stream");
  int64_t index = 0, step = 0;
  if (cuda::inverse_info_singular(report, &index, &step)) ctx.check(cuda::inverse_singular_status(index, step));
}

void inverse_cuda_compute(const OrtOpContext& ctx) {
  const Input& x = ctx.inputs[0];
  const bool nan_on_singular = ctx.call.attr_string("on_singular") == "nan";
  void* y = ctx.output(0);
  const InverseDims d = inverse_dims(x.shape);
  if (d.batch == 0) return;
  if (x.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    launch<float>(ctx, x, y, d, nan_on_singular);
  } else {
    launch<double>(ctx, x, y, d, nan_on_singular);
  }
}

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_ORT_OP(opbridge::inverse_decl, "CUDAExecutionProvider", opbridge::ort::inverse_cuda_compute);
