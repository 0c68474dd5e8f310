// ORT CPU op ai.opbridge::GroupNorm: types, attributes, checks and shape inference come from the
// declaration (group_norm_decl.cpp); this file only runs the kernel.
#include "opbridge/group_norm.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

void group_norm_compute(const OrtOpContext& ctx) {
  const Input& x = ctx.inputs[0];
  const Input& scale = ctx.inputs[1];
  const Input& bias = ctx.inputs[2];
  if (ctx.call.attr_string("activation") != "none") {
    ctx.check(Status::NotImplemented("activation '" + ctx.call.attr_string("activation") +
                                     "' is not implemented by this build"));
  }
  void* y = ctx.output(0);
  const GroupNormDims d = group_norm_dims(x.shape, ctx.call.attr_int("num_groups"));
  if (d.S == 0) return;
  dispatch_elem(x.type, [&](auto tag) {
    using T = decltype(tag);
    ctx.check(group_norm_cpu<T>(x.as<T>(), scale.present ? scale.as<T>() : nullptr, bias.present ? bias.as<T>() : nullptr,
                                static_cast<T*>(y), d.N, d.C, d.S, d.G, ctx.call.attr_float("eps"), nullptr, nullptr,
                                ctx.io.parallel()));
  });
}

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_ORT_OP(opbridge::group_norm_decl, nullptr, opbridge::ort::group_norm_compute);
