// ORT CPU op LogCumSumExp (input X; attribute axis), on opbridge's ORT adapter layer.
#include <opbridge/ort/ort_op.h>

#include <string>
#include <vector>

#include "userops/log_cumsum_exp.h"

namespace userops {
namespace {

using namespace opbridge::ort;

template <class T>
class LogCumSumExpKernel {
 public:
  explicit LogCumSumExpKernel(const OrtKernelInfo* info) : label_(node_label(info, kLogCumSumExpOpType)) {
    try {
      axis_ = attr_int(info, "axis");
    } catch (const Error& e) {
      fail(ORT_INVALID_ARGUMENT, label_ + ": " + e.what());
    }
  }

  void Compute(KernelIO& io) {
    const Input x = io.input(0);
    ScanDims dims;
    check(log_cumsum_exp_check(x.shape, axis_, &dims), label_);
    T* y = io.output_as<T>(0, x.shape);
    check(log_cumsum_exp_cpu<T>(x.as<T>(), y, dims, io.parallel()), label_);
  }

 private:
  std::string label_;
  int64_t axis_ = 0;
};

template <class T>
OpSpec spec() {
  return make_op<LogCumSumExpKernel<T>>(kLogCumSumExpOpType, nullptr, {onnx_type<T>()}, {false}, {onnx_type<T>()});
}

std::vector<OpSpec> specs() { return {spec<float>(), spec<double>()}; }

}  // namespace
}  // namespace userops

OPBRIDGE_REGISTER_ORT_OPS(userops::specs);
