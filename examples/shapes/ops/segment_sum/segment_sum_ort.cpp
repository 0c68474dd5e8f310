// ORT CPU ops com.example.shapes::SegmentSum and SegmentSumBackward: types, attributes, checks and shape inference
// come from the declarations (segment_sum_decl.cpp); these functions only run the kernels.
#include <opbridge/ort/ort_op.h>

#include "segment_sum.h"

namespace shapes {
namespace {

using namespace opbridge::ort;

void segment_sum_compute(const OrtOpContext& ctx) {
  ctx.check(opbridge::dispatch<float, double>(ctx.call.in("values").type, [&](auto tag) {
    using T = decltype(tag);
    return segment_sum_cpu<T>(ctx.in("values").as<T>(), ctx.in("segment_ids").as<int64_t>(), ctx.output_as<T>(0),
                              segment_sum_dims(ctx.call), ctx.io.parallel());
  }));
}

void segment_sum_backward_compute(const OrtOpContext& ctx) {
  ctx.check(opbridge::dispatch<float, double>(ctx.call.in("values").type, [&](auto tag) {
    using T = decltype(tag);
    return segment_sum_backward_cpu<T>(ctx.in("grad").as<T>(), ctx.in("segment_ids").as<int64_t>(),
                                       ctx.output_as<T>(0), segment_sum_dims(ctx.call), ctx.io.parallel());
  }));
}

}  // namespace
}  // namespace shapes

OPBRIDGE_ORT_OP(shapes::segment_sum_decl, nullptr, shapes::segment_sum_compute);
OPBRIDGE_ORT_OP(shapes::segment_sum_backward_decl, nullptr, shapes::segment_sum_backward_compute);
