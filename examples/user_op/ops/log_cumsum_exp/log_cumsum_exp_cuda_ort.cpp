// ORT CUDA op LogCumSumExp: the same op for the CUDA execution provider, on ORT's stream.
#include <opbridge/ort/ort_op.h>

#include <string>
#include <vector>

#include "userops/log_cumsum_exp.cuh"

namespace userops {
namespace {

using namespace opbridge::ort;

template <class T>
class LogCumSumExpCudaKernel {
 public:
  explicit LogCumSumExpCudaKernel(const OrtKernelInfo* info) : label_(node_label(info, kLogCumSumExpOpType)) {
    try {
      axis_ = attr_int(info, "axis");
    } catch (const Error& e) {
      fail(ORT_INVALID_ARGUMENT, label_ + ": " + e.what());
    }
  }

  void Compute(KernelIO& io) {
    const Input x = io.input(0);  // shape on the host, data on the device
    ScanDims dims;
    check(log_cumsum_exp_check(x.shape, axis_, &dims), label_);
    T* y = io.output_as<T>(0, x.shape);
    const cudaError_t err =
        launch_log_cumsum_exp<T>(static_cast<cudaStream_t>(io.gpu_stream()), x.as<T>(), y, dims);
    if (err != cudaSuccess) fail(ORT_RUNTIME_EXCEPTION, label_ + ": CUDA error: " + cudaGetErrorString(err));
  }

 private:
  std::string label_;
  int64_t axis_ = 0;
};

template <class T>
OpSpec spec() {
  return make_op<LogCumSumExpCudaKernel<T>>(kLogCumSumExpOpType, "CUDAExecutionProvider", {onnx_type<T>()}, {false},
                                            {onnx_type<T>()});
}

std::vector<OpSpec> specs() { return {spec<float>(), spec<double>()}; }

}  // namespace
}  // namespace userops

OPBRIDGE_REGISTER_ORT_OPS(userops::specs);
