// ORT CPU ops com.example.shapes::WindowStats and WindowStatsBackward: types, attributes, checks and shape inference
// come from the declarations (window_stats_decl.cpp); these functions only run the kernels.
#include <opbridge/ort/ort_op.h>

#include "window_stats.h"

namespace shapes {
namespace {

using namespace opbridge::ort;

void window_stats_compute(const OrtOpContext& ctx) {
  ctx.check(opbridge::dispatch<float, double>(ctx.call.in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return window_stats_cpu<T>(ctx.in("x").as<T>(), ctx.output_as<T>(0), ctx.output_as<T>(1),
                               window_stats_dims(ctx.call), ctx.io.parallel());
  }));
}

void window_stats_backward_compute(const OrtOpContext& ctx) {
  ctx.check(opbridge::dispatch<float, double>(ctx.call.in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return window_stats_backward_cpu<T>(ctx.in("grad_sum").as<T>(), ctx.in("grad_sumsq").as<T>(), ctx.in("x").as<T>(),
                                        ctx.output_as<T>(0), window_stats_dims(ctx.call), ctx.io.parallel());
  }));
}

}  // namespace
}  // namespace shapes

OPBRIDGE_ORT_OP(shapes::window_stats_decl, nullptr, shapes::window_stats_compute);
OPBRIDGE_ORT_OP(shapes::window_stats_backward_decl, nullptr, shapes::window_stats_backward_compute);
