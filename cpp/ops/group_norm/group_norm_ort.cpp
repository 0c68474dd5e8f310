// ORT CPU op ai.opbridge::GroupNorm (inputs X, scale?, bias?; attrs num_groups, epsilon,
// activation). ONNX tensors are NCHW: the kernel runs on the [N, C, S] view.
#include <string>
#include <vector>

#include "opbridge/group_norm.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

// The `activation` attribute ("none" when absent); an unknown value is an error naming it.
Activation read_activation(const std::string& name) {
  Activation act = Activation::kNone;
  const Status st = parse_activation(name, &act);
  if (!st.ok()) fail(ORT_INVALID_ARGUMENT, "attribute '" + std::string("activation") + "': " + st.message());
  return act;
}

template <class T>
class GroupNormKernel {
 public:
  explicit GroupNormKernel(const OrtKernelInfo* info)
      : label_(node_label(info, kGroupNormOpType)), num_groups_(0), epsilon_(0.f), act_(Activation::kNone) {
    try {
      num_groups_ = attr_int(info, "num_groups");
      epsilon_ = attr_float(info, "epsilon", 1e-5f);
      act_ = read_activation(attr_string(info, "activation", "none"));
    } catch (const Error& e) {
      fail(ORT_INVALID_ARGUMENT, label_ + ": " + e.what());
    }
  }

  void Compute(KernelIO& io) {
    const Input x = io.input(0);
    const Input scale = io.input(1);
    const Input bias = io.input(2);
    check(group_norm_check(x.rank(), x.rank() >= 2 ? x.shape[1] : 0, num_groups_,
                           scale.present ? scale.numel : -1, bias.present ? bias.numel : -1, epsilon_,
                           "scale"),
          label_);
    T* y = io.output_as<T>(0, x.shape);
    const GroupNormDims d = group_norm_dims(x.shape.data(), x.shape.size(), num_groups_, false);
    check(group_norm_cpu<T>(x.as<T>(), scale.present ? scale.as<T>() : nullptr,
                            bias.present ? bias.as<T>() : nullptr, y, d, epsilon_, act_, nullptr, nullptr,
                            io.parallel()),
          label_);
  }

 private:
  std::string label_;
  int64_t num_groups_;
  float epsilon_;
  Activation act_;
};

// Output type and shape at model load: Y has X's. What is known statically is validated with the
// kernel's own checks first, so an invalid node is not given a shape (see InferOutputShapeFn).
void group_norm_infer(const InferIO& io) {
  const std::string label = std::string(kDomain) + "::" + kGroupNormOpType;
  int64_t num_groups = 0;
  // `activation` is checked when the kernel is created (still at session creation), where the
  // message can name the node.
  try {
    num_groups = io.attr_int("num_groups");
  } catch (const Error& e) {
    fail(ORT_INVALID_ARGUMENT, label + ": " + e.what());
  }
  const InferInput x = io.input(0);
  if (x.present && x.rank() > 0) {  // rank 0: unknown (see InferInput::shape)
    const int64_t channels = x.rank() >= 2 ? x.shape[1] : 0;
    if (x.rank() < 2 || channels >= 0) {
      const InferInput scale = io.input(1);
      const InferInput bias = io.input(2);
      check(group_norm_check(x.rank(), channels, num_groups,
                             scale.present ? scale.static_numel() : -1, bias.present ? bias.static_numel() : -1,
                             io.attr_float("epsilon", 1e-5f), "scale"),
            label);
    }
  }
  io.set_output_like_input(0, 0);
}

template <class T>
OpSpec group_norm_spec() {
  const auto t = onnx_type<T>();
  OpSpec s = make_op<GroupNormKernel<T>>(kGroupNormOpType, nullptr, {t, t, t}, {false, true, true}, {t});
  s.infer_shape = group_norm_infer;
  return s;
}

std::vector<OpSpec> group_norm_specs() {
  return {group_norm_spec<float>(), group_norm_spec<double>(), group_norm_spec<Half>(),
          group_norm_spec<BFloat16>()};
}

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_REGISTER_ORT_OPS(opbridge::ort::group_norm_specs);
