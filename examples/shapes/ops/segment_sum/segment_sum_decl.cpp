// The contract of shapes::segment_sum, written once: the torch schema and checks, the ORT registration
// (types, attributes, shape inference), the fake kernel, the ONNX OpSchema, both exporters' rules
// and the autograd formula are all derived from these declarations.
#include <string>

#include "segment_sum.h"

namespace shapes {
namespace {

using opbridge::OpCall;
using opbridge::Status;
using opbridge::TensorArg;

// The op's own checks, after the generic ones (types, ranks). Sizes may be unknown (-1) in shape
// inference and fake kernels: checks on them are skipped there and run again in the kernels.
// The backward runs them too, and checks grad against y's shape, from the declarations.
Status validate(const OpCall& call) {
  const TensorArg& v = call.in("values");
  const TensorArg& ids = call.in("segment_ids");
  if (v.known(0) && ids.known(0) && v.dim(0) != ids.dim(0)) {
    return Status::InvalidArgument("segment_ids must have one id per row of values (" + std::to_string(v.dim(0)) +
                                   "), got " + std::to_string(ids.dim(0)));
  }
  // host_memory(): the ids' values, where known (not in fake kernels or shape inference), are checked here.
  const int64_t n = call.attr_int("num_segments");
  for (int64_t i = 0; ids.int64_data() != nullptr && i < ids.dim(0); ++i) {
    if (ids.int64_data()[i] < 0 || ids.int64_data()[i] >= n) {
      return Status::InvalidArgument("segment_ids[" + std::to_string(i) + "] = " + std::to_string(ids.int64_data()[i]) +
                                     " is outside [0, num_segments = " + std::to_string(n) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

SegmentSumParams segment_sum_params(const opbridge::KernelCall& k) {
  const TensorArg& v = k.arg("values");
  return {v.dim(0), v.dim(1), k.call().attr_int("num_segments")};
}

const opbridge::OpDecl& segment_sum_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("segment_sum", "SegmentSum", 1)
          .doc("y[s] = the sum of the rows values[i] with segment_ids[i] == s.")
          .input("values", "T", "rows to add").shape("(N, D)").rank(2)
          .input("segment_ids", "I", "the segment of each row, in [0, num_segments)").shape("(N,)").rank(1)
          .host_memory()
          .attr_int("num_segments", "number of segments (rows of y)").required()
          .types("T", kFloat32And64)
          .types("I", {ElemType::kInt64})
          .output("y", "T", "num_segments, values[1]", "(num_segments, D)")
          .check(validate);
  return decl;
}

// The backward: the gradient of y, then every argument of the forward (args_of); its output is
// the gradient of values (gradient_of), from which opbridge registers the op's autograd.
const opbridge::OpDecl& segment_sum_backward_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("segment_sum_backward", "SegmentSumBackward", 1)
          .doc("Gradient of SegmentSum with respect to values, given the gradient of y.")
          .input("grad", "T", "gradient of y").shape("(num_segments, D), the shape of y")
          .args_of(segment_sum_decl())
          .output("grad_values", "T", "values", "shape of values")
          .gradient_of(segment_sum_decl(), {"values"});
  return decl;
}

}  // namespace shapes
