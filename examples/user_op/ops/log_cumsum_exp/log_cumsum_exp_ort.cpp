// ORT CPU op com.example.userops::LogCumSumExp: types, the axis attribute, checks and shape
// inference come from the declaration (log_cumsum_exp_decl.cpp); this file runs the kernel.
#include <opbridge/ort/ort_op.h>

#include "log_cumsum_exp.h"

namespace userops {
namespace {

using namespace opbridge::ort;

void log_cumsum_exp_compute(const OrtOpContext& ctx) {
  const ScanDims d = log_cumsum_exp_dims(ctx.call);
  ctx.check(opbridge::dispatch<float, double>(ctx.call.in("x").type, [&](auto tag) {
    using T = decltype(tag);
    return log_cumsum_exp_cpu<T>(ctx.in("x").as<T>(), ctx.output_as<T>(0), d, ctx.io.parallel());
  }));
}

}  // namespace
}  // namespace userops

OPBRIDGE_ORT_OP(userops::log_cumsum_exp_decl, nullptr, userops::log_cumsum_exp_compute);
