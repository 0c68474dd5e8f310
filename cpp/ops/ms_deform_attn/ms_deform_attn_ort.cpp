// ORT CPU op ai.opbridge::MultiScaleDeformableAttention: types, checks (incl. the level sizes'
// values) and shape inference come from the declaration (ms_deform_attn_decl.cpp); this file only
// runs the kernel.
#include "opbridge/ms_deform_attn.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

void ms_deform_attn_compute(const OrtOpContext& ctx) {
  const Input &value = ctx.inputs[0], &shapes = ctx.inputs[1], &starts = ctx.inputs[2], &loc = ctx.inputs[3],
              &weights = ctx.inputs[4];
  MsDeformAttnDims d;
  const auto a = [](const Input& in) { return MsDeformAttnArg{in.shape.data(), in.rank(), type_name(in.type)}; };
  // Already validated (check_call); this call only fills the sizes.
  ctx.check(ms_deform_attn_check(a(value), a(shapes), a(starts), a(loc), a(weights), shapes.as<int64_t>(),
                                 starts.as<int64_t>(), nullptr, &d));
  void* out = ctx.output(0);
  dispatch_elem(value.type, [&](auto tag) {
    using T = decltype(tag);
    ctx.check(ms_deform_attn_cpu<T>(value.as<T>(), shapes.as<int64_t>(), starts.as<int64_t>(), loc.as<T>(),
                                    weights.as<T>(), static_cast<T*>(out), d, ctx.io.parallel()));
  });
}

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_ORT_OP(opbridge::ms_deform_attn_decl, nullptr, opbridge::ort::ms_deform_attn_compute);
