// ORT CPU op ai.opbridge::GroupNorm: types, attributes, checks and shape inference come from the
// declaration (group_norm_decl.cpp); this file only runs the kernel. ONNX tensors are NCHW: the
// kernel runs on the [N, C, S] view.
#include "opbridge/group_norm.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

void group_norm_compute(const OrtOpContext& ctx) {
  const Input& x = ctx.inputs[0];
  const Input& scale = ctx.inputs[1];
  const Input& bias = ctx.inputs[2];
  void* y = ctx.output(0);
  const GroupNormDims d = group_norm_dims(x.shape, ctx.call.attr_int("num_groups"));
  const Activation act = activation_from_name(ctx.call.attr_string("activation"));
  dispatch_elem(x.type, [&](auto tag) {
    using T = decltype(tag);
    ctx.check(group_norm_cpu<T>(x.as<T>(), scale.present ? scale.as<T>() : nullptr,
                                bias.present ? bias.as<T>() : nullptr, static_cast<T*>(y), d,
                                ctx.call.attr_float("eps"), act, nullptr, nullptr, ctx.io.parallel()));
  });
}

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_ORT_OP(opbridge::group_norm_decl, nullptr, opbridge::ort::group_norm_compute);
