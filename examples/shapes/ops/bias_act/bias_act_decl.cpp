// The contract of shapes::bias_act, written once: the torch schema and checks, the ORT registration
// (types, attributes, shape inference), the fake kernel, the ONNX OpSchema and both exporters'
// rules are all derived from these declarations and their validation.
#include <string>

#include "bias_act.h"

namespace shapes {
namespace {

using opbridge::OpCall;
using opbridge::Status;
using opbridge::TensorArg;

Status validate(const OpCall& call) {
  const TensorArg& x = call.in("x");
  const TensorArg& b = call.in("bias");
  if (b.present && x.known(-1) && b.known(0) && b.dim(0) != x.dim(-1)) {
    return Status::InvalidArgument("bias must have C = x.shape[-1] = " + std::to_string(x.dim(-1)) +
                                   " elements, got " + std::to_string(b.dim(0)));
  }
  return Status::Ok();
}

Status validate_backward(const OpCall& call) {
  const TensorArg& g = call.in("grad");
  const TensorArg& x = call.in("x");
  if (g.rank_known && x.rank_known && (g.rank() != x.rank() || (g.all_known() && x.all_known() && g.shape != x.shape))) {
    return Status::InvalidArgument("grad must have x's shape");
  }
  return validate(call);
}

}  // namespace

const opbridge::OpDecl& bias_act_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("bias_act", "BiasAct", 1)
          .doc("y = activation(x + bias), bias optional, one per channel (the last dimension).")
          .input("x", "T", "input").shape("(*, C)").min_rank(1)
          .input("bias", "T", "one per channel").optional().shape("(C,)").rank(1)
          .attr_string("activation", "none", "none, relu or tanh").choices({"none", "relu", "tanh"})
          .types("T", kFloat32And64)
          .output("y", "T", "x", "shape of x")
          .check(validate);
  return decl;
}

const opbridge::OpDecl& bias_act_backward_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("bias_act_backward", "BiasActBackward", 1)
          .doc("Gradients of BiasAct with respect to x and bias, given the gradient of y.")
          .input("grad", "T", "gradient of y").shape("the shape of x")
          .input("x", "T", "input").shape("(*, C)").min_rank(1)
          .input("bias", "T", "one per channel").optional().shape("(C,)").rank(1)
          .attr_string("activation", "none", "none, relu or tanh").choices({"none", "relu", "tanh"})
          .types("T", kFloat32And64)
          .output("grad_x", "T", "x", "shape of x")
          .output("grad_bias", "T", "x[-1]", "(C,)")
          .check(validate_backward);
  return decl;
}

}  // namespace shapes
