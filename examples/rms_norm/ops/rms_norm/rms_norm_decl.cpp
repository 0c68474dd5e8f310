// The contract of myops::rms_norm, written once: the torch schema and checks, the ORT registration
// (types, attributes, shape inference), the fake kernel, the ONNX OpSchema and both exporters'
// rules are all derived from these declarations and their validation.
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

Status validate_backward(const OpCall& call) {
  const TensorArg& grad = call.in("grad");
  const TensorArg& x = call.in("x");
  if (grad.rank_known && x.rank_known && grad.rank() == x.rank()) {
    for (int64_t i = 0; i < x.rank(); ++i) {
      if (grad.known(i) && x.known(i) && grad.dim(i) != x.dim(i)) {
        return Status::InvalidArgument("grad must have x's shape, got a mismatch in dimension " + std::to_string(i));
      }
    }
  } else if (grad.rank_known && x.rank_known) {
    return Status::InvalidArgument("grad must have x's shape (rank " + std::to_string(x.rank()) + "), got rank " +
                                   std::to_string(grad.rank()));
  }
  return validate(call);
}

}  // namespace

RmsNormDims rms_norm_dims(const OpCall& call) {
  const TensorArg& x = call.in("x");
  RmsNormDims d;
  d.channels = x.dim(-1);
  const int64_t numel = x.numel();  // validated: no overflow
  d.rows = d.channels == 0 ? 0 : numel / d.channels;
  return d;
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

const opbridge::OpDecl& rms_norm_backward_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("rms_norm_backward", "RmsNormBackward", 1)
          .doc("Gradients of RmsNorm with respect to x and weight, given the gradient of y.")
          .input("grad", "T", "gradient of y").shape("(*, C), the shape of x")
          .input("x", "T", "input").shape("(*, C)").min_rank(1)
          .input("weight", "T", "one weight per channel").shape("(C,)").rank(1)
          .attr_float("eps", 1e-5, "added to the mean square").onnx_name("epsilon")
          .types("T", kFloat32And64)
          .output("grad_x", "T", "x", "shape of x")
          .output("grad_weight", "T", "weight", "shape of weight")
          .check(validate_backward);
  return decl;
}

}  // namespace myops
