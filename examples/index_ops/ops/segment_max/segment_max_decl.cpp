// The contract of index_ops::segment_max, written once: the torch schema and checks, the ORT registration
// (types, attributes, shape inference), the fake kernel, the ONNX OpSchema, both exporters' rules
// and the autograd formula are all derived from these declarations.
#include <string>

#include "segment_max.h"

namespace index_ops {
namespace {

using opbridge::OpCall;
using opbridge::Status;
using opbridge::TensorArg;

// The op's own checks, after the generic ones (types, ranks). Sizes may be unknown (-1) in shape
// inference and fake kernels: checks on them are skipped there and run again in the kernels.
// The backward runs them too, and checks grad and argmax against the forward's output shapes.
Status validate(const OpCall& call) {
  const int64_t rows = call.in("values").dim(0), ids = call.in("segment_ids").dim(0);  // -1: unknown
  if (rows >= 0 && ids >= 0 && rows != ids) {
    return Status::InvalidArgument("segment_ids must have one id per row of values (" + std::to_string(rows) +
                                   "), got " + std::to_string(ids));
  }
  return opbridge::check_index_values(call, "segment_ids", 0, call.attr_int("num_segments"));
}

// The backward indexes rows with argmax (the backward op may be called directly, with any argmax).
Status validate_backward(const OpCall& call) {
  return opbridge::check_index_values(call, "argmax", -1, call.in("values").dim(0));
}

}  // namespace

SegmentMaxParams segment_max_params(const opbridge::KernelCall& k) {
  return {k.arg("values").dim(0), k.arg("values").dim(1), k.call().attr_int("num_segments")};
}

const opbridge::OpDecl& segment_max_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("segment_max", "SegmentMax", 1)
          .doc("y[s, c] = max of values[i, c] with segment_ids[i] == s (0 if none); argmax[s, c] = that i (-1).")
          .input("values", "T", "rows to reduce").shape("(N, D)").rank(2)
          .input("segment_ids", "I", "the segment of each row, in [0, num_segments)").shape("(N,)").rank(1).host_memory()
          .attr_int("num_segments", "number of segments (rows of y)").required()
          .types("T", kFloat32And64)
          .types("I", {ElemType::kInt64})
          .output("y", "T", "num_segments, values[1]", "(num_segments, D)")
          .output("argmax", "I", "num_segments, values[1]", "(num_segments, D) int64, no gradient")
          .check(validate);
  return decl;
}

// The backward takes y's gradient and the forward's argmax (saved by autograd: an input named like
// the forward's output), then every argument of the forward (args_of); argmax has no gradient.
const opbridge::OpDecl& segment_max_backward_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("segment_max_backward", "SegmentMaxBackward", 1)
          .doc("Gradient of SegmentMax with respect to values, given y's gradient and argmax.")
          .input("grad", "T", "gradient of y").shape("(num_segments, D), the shape of y")
          .input("argmax", "I", "the forward's argmax").host_memory()
          .args_of(segment_max_decl())
          .output("grad_values", "T", "values", "shape of values")
          .gradient_of(segment_max_decl(), {"values"})
          .check(validate_backward);
  return decl;
}

}  // namespace index_ops
