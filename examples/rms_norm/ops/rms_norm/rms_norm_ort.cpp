// ORT CPU ops com.example.myops::RmsNorm and RmsNormBackward: types, attributes, checks and shape inference
// come from the declarations (rms_norm_decl.cpp); these functions only run the kernels.
#include <opbridge/ort/ort_op.h>

#include "rms_norm.h"

namespace myops {
namespace {

using namespace opbridge::ort;

void rms_norm_compute(const OrtOpContext& ctx) {
  const RmsNormDims d = rms_norm_dims(ctx.call);
  const double eps = ctx.call.attr_float("eps");
  ctx.check(opbridge::dispatch<float, double>(ctx.call.in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return rms_norm_cpu<T>(ctx.in("x").as<T>(), ctx.in("weight").as<T>(), ctx.output_as<T>(0), d, eps,
                       ctx.io.parallel());
  }));
}

void rms_norm_backward_compute(const OrtOpContext& ctx) {
  const RmsNormDims d = rms_norm_dims(ctx.call);
  const double eps = ctx.call.attr_float("eps");
  ctx.check(opbridge::dispatch<float, double>(ctx.call.in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return rms_norm_backward_cpu<T>(ctx.in("grad").as<T>(), ctx.in("x").as<T>(), ctx.in("weight").as<T>(),
                                ctx.output_as<T>(0), ctx.output_as<T>(1), d, eps, ctx.io.parallel());
  }));
}

}  // namespace
}  // namespace myops

OPBRIDGE_ORT_OP(myops::rms_norm_decl, nullptr, myops::rms_norm_compute);
OPBRIDGE_ORT_OP(myops::rms_norm_backward_decl, nullptr, myops::rms_norm_backward_compute);
