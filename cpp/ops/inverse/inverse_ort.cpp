// ORT CPU op ai.opbridge::Inverse (input X (*, n, n), output Y of the same shape; f32/f64;
// string attribute on_singular: "raise" (default) or "nan").
#include <string>
#include <vector>

#include "opbridge/inverse.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

template <class T>
class InverseKernel {
 public:
  explicit InverseKernel(const OrtKernelInfo* info) : label_(node_label(info, kInverseOpType)) {
    // Read and checked once, at session creation: a bad value fails there, naming the node.
    std::string on_singular;
    try {
      on_singular = attr_string(info, kInverseOnSingularAttr, kInverseOnSingularDefault);
    } catch (const Error& e) {
      fail(ORT_INVALID_ARGUMENT, label_ + ": " + e.what());
    }
    check(inverse_parse_on_singular(on_singular.c_str(), &nan_on_singular_), label_);
  }

  void Compute(KernelIO& io) {
    const Input x = io.input(0);
    const int64_t r = x.rank();
    check(inverse_check(r, r >= 2 ? x.shape[r - 2] : 0, r >= 1 ? x.shape[r - 1] : 0), label_);
    const int64_t n = x.shape[r - 1];
    // An empty x has no matrices; only then could n * n overflow (x = [0, 2^32, 2^32] made it 0).
    const int64_t batch = x.numel == 0 ? 0 : x.numel / (n * n);
    T* y = io.output_as<T>(0, x.shape);
    check(inverse_cpu<T>(x.as<T>(), y, batch, n, io.parallel(), CpuIsa::kAuto, nan_on_singular_), label_);
  }

 private:
  std::string label_;
  bool nan_on_singular_ = false;
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
