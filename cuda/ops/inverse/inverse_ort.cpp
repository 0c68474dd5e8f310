// ORT CUDA op ai.opbridge::Inverse for the CUDAExecutionProvider (same input, output and checks
// as the CPU op), queued on ORT's compute stream.
//
// Attribute on_singular (since op version 2): "raise" (default): a singular matrix is an error, as
// on the CPU: the kernel reports it in an 8-byte device word that is read back after the launch,
// which synchronizes ORT's compute stream once per call (torch.linalg.inv synchronizes for its
// error check the same way). "nan": a singular matrix's output is all NaN, nothing is read back
// and nothing synchronizes.
#include <string>
#include <vector>

#include "../../common/adapter_checks.h"
#include "../../common/ort_attr.h"
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
class InverseCudaKernel {
 public:
  explicit InverseCudaKernel(const OrtKernelInfo* info) : label_(node_label(info, kInverseOpType)) {
    try {
      const std::string on_singular = cuda_attr_string(info, "on_singular", "raise");
      const Status st = cuda_checks::parse_on_singular(on_singular, &nan_on_singular_);
      if (!st.ok()) fail(ORT_INVALID_ARGUMENT, st.message());
    } catch (const Error& e) {
      fail(ORT_INVALID_ARGUMENT, label_ + ": " + e.what());
    }
  }

  void Compute(KernelIO& io) {
    const Input x = io.input(0);
    const int64_t rank = x.rank();
    check(inverse_check(rank, rank >= 2 ? x.shape[rank - 2] : 0, rank >= 1 ? x.shape[rank - 1] : 0), label_);
    const int64_t n = x.shape[rank - 1];
    int64_t batch = 1;
    for (int64_t i = 0; i + 2 < rank; ++i) batch *= x.shape[i];
    T* y = io.output_as<T>(0, x.shape);
    if (x.numel == 0) return;

    // One scratch block from the CUDA EP's allocator: the 8-byte report, then the workspace.
    constexpr size_t kInfoBytes = 16;  // keeps the workspace 16-byte aligned
    const size_t ws_bytes = cuda::inverse_workspace_bytes<T>(batch, n);
    const Scratch scratch = io.scratch(kInfoBytes + ws_bytes, 0);
    auto* info = static_cast<uint64_t*>(scratch.get());
    void* ws = ws_bytes > 0 ? static_cast<char*>(scratch.get()) + kInfoBytes : nullptr;
    const auto stream = static_cast<cudaStream_t>(io.gpu_stream());
    check_cuda(cuda::launch_inverse<T>(stream, x.as<T>(), y, batch, n, info, ws, ws_bytes, nan_on_singular_), label_,
               "CUDA launch");
    if (nan_on_singular_) return;
    uint64_t report = cuda::kInverseInfoOk;
    check_cuda(cudaMemcpyAsync(&report, info, sizeof report, cudaMemcpyDeviceToHost, stream), label_,
               "reading the singular-matrix report");
    check_cuda(cudaStreamSynchronize(stream), label_, "synchronizing the compute stream");
    int64_t index = 0, step = 0;
    if (cuda::inverse_info_singular(report, &index, &step)) check(cuda::inverse_singular_status(index, step), label_);
  }

 private:
  std::string label_;
  bool nan_on_singular_ = false;
};

constexpr const char* kCudaProvider = "CUDAExecutionProvider";

template <class T>
OpSpec inverse_cuda_spec() {
  const auto t = onnx_type<T>();
  return make_op<InverseCudaKernel<T>>(kInverseOpType, kCudaProvider, {t}, {false}, {t});
}

std::vector<OpSpec> inverse_cuda_specs() { return {inverse_cuda_spec<float>(), inverse_cuda_spec<double>()}; }

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_REGISTER_ORT_OPS(opbridge::ort::inverse_cuda_specs);
