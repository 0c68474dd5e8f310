// The contract of shapes::window_stats, written once: the torch schema and checks, the ORT registration
// (types, attributes, shape inference), the fake kernel, the ONNX OpSchema, both exporters' rules
// and the autograd formula are all derived from these declarations.
#include <string>

#include "window_stats.h"

namespace shapes {
namespace {

using opbridge::OpCall;
using opbridge::Status;

// The op's own check, after the generic ones (types, ranks). The backward runs it too, and checks
// grad_sum and grad_sumsq against the outputs' shapes, from the declarations.
Status validate(const OpCall& call) {
  const int64_t w = call.attr_int("window");
  return w >= 1 ? Status::Ok() : Status::InvalidArgument("window must be >= 1, got " + std::to_string(w));
}

}  // namespace

WindowStatsParams window_stats_params(const opbridge::KernelCall& k) {
  const opbridge::TensorArg& x = k.arg("x");
  return {x.dim(0), x.dim(1), k.call().attr_int("window")};
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

// The backward: the gradients of sum and sumsq, then every argument of the forward (args_of); its
// output is the gradient of x (gradient_of), from which opbridge registers the op's autograd.
const opbridge::OpDecl& window_stats_backward_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("window_stats_backward", "WindowStatsBackward", 1)
          .doc("Gradient of WindowStats with respect to x, given the gradients of its outputs.")
          .input("grad_sum", "T", "gradient of sum").shape("(N, L // window)")
          .input("grad_sumsq", "T", "gradient of sumsq").shape("(N, L // window)")
          .args_of(window_stats_decl())
          .output("grad_x", "T", "x", "shape of x")
          .gradient_of(window_stats_decl(), {"x"});
  return decl;
}

}  // namespace shapes
