// The contract of shapes::window_stats, written once: the torch schema and checks, the ORT registration
// (types, attributes, shape inference), the fake kernel, the ONNX OpSchema and both exporters'
// rules are all derived from these declarations and their validation.
#include <string>

#include "window_stats.h"

namespace shapes {
namespace {

using opbridge::OpCall;
using opbridge::Status;
using opbridge::TensorArg;

Status validate(const OpCall& call) {
  const int64_t w = call.attr_int("window");
  return w >= 1 ? Status::Ok() : Status::InvalidArgument("window must be >= 1, got " + std::to_string(w));
}

}  // namespace

WindowStatsDims window_stats_dims(const OpCall& call) {
  return {call.in("x").dim(0), call.in("x").dim(1), call.attr_int("window")};
}

const opbridge::OpDecl& window_stats_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("window_stats", "WindowStats", 1)
          .doc("Sums and sums of squares of windows of `window` elements along the last dimension.")
          .input("x", "T", "input").shape("(N, L)").rank(2)
          .attr_int("window", 2, "elements per window")
          .types("T", kFloat32And64)
          .output("sum", "T", "x[0], x[1] // window", "(N, L // window)")
          .output("sumsq", "T", "x[0], x[1] // window", "(N, L // window)")
          .check(validate);
  return decl;
}

const opbridge::OpDecl& window_stats_backward_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("window_stats_backward", "WindowStatsBackward", 1)
          .doc("Gradient of WindowStats with respect to x, given the gradients of its outputs.")
          .input("grad_sum", "T", "gradient of sum").shape("(N, L // window)").rank(2)
          .input("grad_sumsq", "T", "gradient of sumsq").shape("(N, L // window)").rank(2)
          .input("x", "T", "input").shape("(N, L)").rank(2)
          .attr_int("window", 2, "elements per window")
          .types("T", kFloat32And64)
          .output("grad_x", "T", "x", "shape of x")
          .check(validate);
  return decl;
}

}  // namespace shapes
