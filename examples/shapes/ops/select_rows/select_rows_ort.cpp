// ORT CPU ops com.example.shapes::SelectRows and SelectRowsBackward: types, attributes, checks and shape inference
// come from the declarations (select_rows_decl.cpp); these functions only run the kernels.
#include <opbridge/ort/ort_op.h>

#include <vector>

#include "select_rows.h"

namespace shapes {
namespace {

using namespace opbridge::ort;

void select_rows_compute(const OrtOpContext& ctx) {
  const int64_t rows = ctx.call.in("x").dim(0), channels = ctx.call.in("x").dim(1);
  std::vector<uint8_t> keep(static_cast<size_t>(rows));
  ctx.check(opbridge::dispatch<float, double>(ctx.call.in("x").type, [&](auto tag) {
    using T = decltype(tag);
    const T* x = ctx.in("x").as<T>();
    const int64_t n = select_rows_count<T>(x, rows, channels, ctx.call.attr_float("threshold"), keep.data());
    select_rows_copy<T>(x, keep.data(), rows, channels, ctx.output_as<T>(0, {n, channels}));
    return opbridge::Status::Ok();
  }));
}

}  // namespace
}  // namespace shapes

OPBRIDGE_ORT_OP(shapes::select_rows_decl, nullptr, shapes::select_rows_compute);
