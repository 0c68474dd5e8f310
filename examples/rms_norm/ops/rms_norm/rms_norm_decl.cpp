// The contract of myops::rms_norm, written once: the torch schema and checks, the ORT registration
// (types, attributes, shape inference), the fake kernel, the ONNX OpSchema, both exporters' rules
// and the autograd formula are all derived from these declarations.
#include <cmath>
#include <string>

#include "rms_norm.h"

namespace myops {
namespace {

using opbridge::OpCall;
using opbridge::Status;
using opbridge::TensorArg;

// The op's own checks, after the generic ones (types, ranks). Sizes may be unknown (-1) in shape
// inference and fake kernels: checks on them are skipped there and run again in the kernels.
// The backward runs them too, and checks grad against Y's shape, from the declarations.
Status validate(const OpCall& call) {
  const TensorArg& x = call.in("x");
  const TensorArg& w = call.in("weight");
  if (x.known(-1) && w.known(0) && w.dim(0) != x.dim(-1)) {
    return Status::InvalidArgument("weight must have C = x.shape[-1] = " + std::to_string(x.dim(-1)) +
                                   " elements (one per channel), got " + std::to_string(w.dim(0)));
  }
  const double eps = call.attr_float("eps");
  if (!(eps >= 0) || !std::isfinite(eps)) {
    return Status::InvalidArgument("eps must be finite and >= 0, got " + std::to_string(eps));
  }
  return Status::Ok();
}

}  // namespace

RmsNormParams rms_norm_params(const opbridge::KernelCall& k) {
  const TensorArg& x = k.arg("x");
  RmsNormParams p;
  p.channels = x.dim(-1);
  p.rows = p.channels == 0 ? 0 : x.numel() / p.channels;  // validated: no overflow
  p.eps = k.call().attr_float("eps");
  return p;
}

const opbridge::OpDecl& rms_norm_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("rms_norm", "RmsNorm", 1)
          .doc("Y = X / sqrt(mean(X^2) + epsilon) * scale over the last dimension of X (RMSNormalization, axis -1).")
          .input("x", "T", "input").onnx_name("X").shape("(*, C)").min_rank(1)
          .input("weight", "T", "one weight per channel").onnx_name("scale").shape("(C,)").rank(1)
          .attr_float("eps", 1e-5, "added to the mean square").onnx_name("epsilon")
          .types("T", kFloat32And64)
          .output("Y", "T", "x", "shape of x")
          .check(validate);
  return decl;
}

// The backward: the gradient of y, then every argument of the forward (args_of); its outputs are
// the gradients of x and weight (gradient_of), from which opbridge registers the op's autograd.
const opbridge::OpDecl& rms_norm_backward_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("rms_norm_backward", "RmsNormBackward", 1)
          .doc("Gradients of RmsNorm with respect to x and weight, given the gradient of Y.")
          .input("grad", "T", "gradient of Y").shape("(*, C), the shape of x")
          .args_of(rms_norm_decl())
          .output("grad_x", "T", "x", "shape of x")
          .output("grad_weight", "T", "weight", "shape of weight")
          .gradient_of(rms_norm_decl(), {"x", "weight"});
  return decl;
}

}  // namespace myops
