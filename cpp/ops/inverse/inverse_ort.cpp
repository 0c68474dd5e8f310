// ORT CPU op ai.opbridge::Inverse: types, attributes, checks and shape inference come from the
// declaration (inverse_decl.cpp); this file only runs the kernel.
#include "opbridge/inverse.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

void inverse_compute(const OrtOpContext& ctx) {
  const Input& x = ctx.inputs[0];
  const bool nan_on_singular = ctx.call.attr_string("on_singular") == "nan";
  void* y = ctx.output(0);
  const InverseDims v = inverse_dims(x.shape);
  if (x.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    ctx.check(inverse_cpu<float>(x.as<float>(), static_cast<float*>(y), v.batch, v.n, ctx.io.parallel(),
                                 CpuIsa::kAuto, nan_on_singular));
  } else {
    ctx.check(inverse_cpu<double>(x.as<double>(), static_cast<double*>(y), v.batch, v.n, ctx.io.parallel(),
                                  CpuIsa::kAuto, nan_on_singular));
  }
}

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_ORT_OP(opbridge::inverse_decl, nullptr, opbridge::ort::inverse_compute);
