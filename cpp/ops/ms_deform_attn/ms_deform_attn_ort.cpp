// ORT CPU op ai.opbridge::MultiScaleDeformableAttention (since domain version 2; no attributes):
// inputs value (N, S, M, D), spatial_shapes (L, 2) int64, level_start_index (L,) int64,
// sampling_locations (N, Lq, M, L, P, 2), attention_weights (N, Lq, M, L, P); output
// (N, Lq, M * D). value, locations, weights and output share one float type T.
#include <string>
#include <vector>

#include "opbridge/ms_deform_attn.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

// The check's view of a kernel input (type named like ms_deform_attn_check expects).
MsDeformAttnArg arg(const Input& in) { return {in.shape.data(), in.rank(), type_name(in.type)}; }

template <class T>
class MsDeformAttnKernel {
 public:
  explicit MsDeformAttnKernel(const OrtKernelInfo* info) : label_(node_label(info, kMsDeformAttnOpType)) {}

  void Compute(KernelIO& io) {
    const Input value = io.input(0), shapes = io.input(1), starts = io.input(2), loc = io.input(3),
                weights = io.input(4);
    // ORT has matched the types already (the kernel is registered for T and int64); the check
    // confirms them and reads the level sizes.
    MsDeformAttnDims d;
    check(ms_deform_attn_check(arg(value), arg(shapes), arg(starts), arg(loc), arg(weights),
                               shapes.as<int64_t>(), starts.as<int64_t>(), nullptr, &d),
          label_);
    T* out = io.output_as<T>(0, {d.N, d.Lq, d.M * d.D});
    check(ms_deform_attn_cpu<T>(value.as<T>(), shapes.as<int64_t>(), starts.as<int64_t>(), loc.as<T>(),
                                weights.as<T>(), out, d, io.parallel()),
          label_);
  }

 private:
  std::string label_;
};

MsDeformAttnArg infer_arg(const InferInput& in) {
  // Unknown rank (reported as rank 0; no input of this op is a scalar): nothing to check.
  if (!in.present || in.rank() == 0) return {};
  return {in.shape.data(), in.rank(), type_name(in.type)};
}

// Output type and shape at model load: (N, Lq, M * D) of value's type, N and Lq keeping their
// symbols. What is known statically is validated with the kernel's own check first, so an
// invalid node is not given a shape (see InferOutputShapeFn).
void ms_deform_attn_infer(const InferIO& io) {
  const std::string label = std::string(kDomain) + "::" + kMsDeformAttnOpType;
  const InferInput value = io.input(0), shapes = io.input(1), starts = io.input(2), loc = io.input(3),
                   weights = io.input(4);
  check(ms_deform_attn_check(infer_arg(value), infer_arg(shapes), infer_arg(starts), infer_arg(loc),
                             infer_arg(weights), nullptr, nullptr, nullptr, nullptr),
        label);
  if (!value.present) return;
  // N and Lq from whichever input knows them (or names them); M * D only when both are known.
  std::vector<int64_t> dims(3, -1);
  std::vector<std::string> symbols(3);
  const auto take = [&](size_t out, const InferInput& in, size_t axis) {
    if (dims[out] >= 0 || static_cast<size_t>(in.rank()) <= axis) return;
    if (in.shape[axis] >= 0) {
      dims[out] = in.shape[axis];
    } else if (symbols[out].empty() && axis < in.symbols.size()) {
      symbols[out] = in.symbols[axis];
    }
  };
  for (const InferInput* in : {&loc, &weights, &value}) take(0, *in, 0);
  for (const InferInput* in : {&loc, &weights}) take(1, *in, 1);
  if (value.rank() == 4 && value.shape[2] >= 0 && value.shape[3] >= 0) {
    int64_t md = 0;
    if (!__builtin_mul_overflow(value.shape[2], value.shape[3], &md)) dims[2] = md;
  }
  io.set_output(0, value.type, dims, symbols);
}

template <class T>
OpSpec ms_deform_attn_spec() {
  const auto t = onnx_type<T>();
  const auto i64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  OpSpec s = make_op<MsDeformAttnKernel<T>>(kMsDeformAttnOpType, nullptr, {t, i64, i64, t, t},
                                             {false, false, false, false, false}, {t});
  s.infer_shape = ms_deform_attn_infer;
  return s;
}

std::vector<OpSpec> ms_deform_attn_specs() {
  return {ms_deform_attn_spec<float>(), ms_deform_attn_spec<double>(), ms_deform_attn_spec<Half>(),
          ms_deform_attn_spec<BFloat16>()};
}

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_REGISTER_ORT_OPS(opbridge::ort::ms_deform_attn_specs);
