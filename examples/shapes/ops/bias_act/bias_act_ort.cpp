// ORT CPU ops com.example.shapes::BiasAct and BiasActBackward: types, attributes, checks and shape inference
// come from the declarations (bias_act_decl.cpp); these functions only run the kernels.
#include <opbridge/ort/ort_op.h>

#include "bias_act.h"

namespace shapes {
namespace {

using namespace opbridge::ort;

void bias_act_compute(const OrtOpContext& ctx) {
  const int64_t C = ctx.call.in("x").dim(-1), rows = C ? ctx.call.in("x").numel() / C : 0;
  ctx.check(opbridge::dispatch<float, double>(ctx.call.in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return bias_act_cpu<T>(ctx.in("x").as<T>(), ctx.in("bias").as<T>(), ctx.output_as<T>(0), rows, C,
                           bias_act_code(ctx.call.attr_string("activation")));
  }));
}

void bias_act_backward_compute(const OrtOpContext& ctx) {
  const int64_t C = ctx.call.in("x").dim(-1), rows = C ? ctx.call.in("x").numel() / C : 0;
  ctx.check(opbridge::dispatch<float, double>(ctx.call.in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return bias_act_backward_cpu<T>(ctx.in("grad").as<T>(), ctx.in("x").as<T>(), ctx.in("bias").as<T>(),
                                    ctx.output_as<T>(0), ctx.output_as<T>(1), rows, C,
                                    bias_act_code(ctx.call.attr_string("activation")));
  }));
}

}  // namespace
}  // namespace shapes

OPBRIDGE_ORT_OP(shapes::bias_act_decl, nullptr, shapes::bias_act_compute);
OPBRIDGE_ORT_OP(shapes::bias_act_backward_decl, nullptr, shapes::bias_act_backward_compute);
