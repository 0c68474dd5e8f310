// ORT CPU op ai.opbridge::Inverse (input X (*, n, n), output Y of the same shape; f32/f64).
#include <string>
#include <vector>

#include "opbridge/inverse.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

template <class T>
class InverseKernel {
 public:
  explicit InverseKernel(const OrtKernelInfo* info) : label_(node_label(info, kInverseOpType)) {}

  void Compute(KernelIO& io) {
    const Input x = io.input(0);
    const int64_t r = x.rank();
    check(inverse_check(r, r >= 2 ? x.shape[r - 2] : 0, r >= 1 ? x.shape[r - 1] : 0), label_);
    const int64_t n = x.shape[r - 1];
    const int64_t batch = n == 0 ? 0 : x.numel / (n * n);
    T* y = io.output_as<T>(0, x.shape);
    check(inverse_cpu<T>(x.as<T>(), y, batch, n, io.parallel()), label_);
  }

 private:
  std::string label_;
};

template <class T>
OpSpec inverse_spec() {
  const auto t = onnx_type<T>();
  return make_op<InverseKernel<T>>(kInverseOpType, nullptr, {t}, {false}, {t});
}

std::vector<OpSpec> inverse_specs() { return {inverse_spec<float>(), inverse_spec<double>()}; }

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_REGISTER_ORT_OPS(opbridge::ort::inverse_specs);
