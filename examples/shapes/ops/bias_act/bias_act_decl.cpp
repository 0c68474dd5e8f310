// The contract of shapes::bias_act, written once: the torch schema and checks, the ORT registration
// (types, attributes, shape inference), the fake kernel, the ONNX OpSchema, both exporters' rules
// and the autograd formula are all derived from these declarations.
#include <string>

#include "bias_act.h"

namespace shapes {
namespace {

using opbridge::OpCall;
using opbridge::Status;
using opbridge::TensorArg;

// The op's own checks, after the generic ones (types, ranks, the activation's choices). Sizes may
// be unknown (-1) in shape inference and fake kernels: checks on them are skipped there and run
// again in the kernels. The backward runs them too, and checks grad against y's shape.
Status validate(const OpCall& call) {
  const TensorArg& x = call.in("x");
  const TensorArg& b = call.in("bias");
  if (b.present && x.known(-1) && b.known(0) && b.dim(0) != x.dim(-1)) {
    return Status::InvalidArgument("bias must have C = x.shape[-1] = " + std::to_string(x.dim(-1)) +
                                   " elements, got " + std::to_string(b.dim(0)));
  }
  return Status::Ok();
}

}  // namespace

BiasActParams bias_act_params(const opbridge::KernelCall& k) {
  const TensorArg& x = k.arg("x");
  const std::string& act = k.call().attr_string("activation");
  BiasActParams p;
  p.channels = x.dim(-1);
  p.rows = p.channels == 0 ? 0 : x.numel() / p.channels;
  p.act = act == "relu" ? 1 : act == "tanh" ? 2 : 0;
  return p;
}

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

// The backward: the gradient of y, then every argument of the forward (args_of); its outputs are
// the gradients of x and bias (gradient_of), from which opbridge registers the op's autograd.
const opbridge::OpDecl& bias_act_backward_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("bias_act_backward", "BiasActBackward", 1)
          .doc("Gradients of BiasAct with respect to x and bias, given the gradient of y.")
          .input("grad", "T", "gradient of y").shape("(*, C), the shape of x")
          .args_of(bias_act_decl())
          .output("grad_x", "T", "x", "shape of x")
          .output("grad_bias", "T", "x[-1]", "(C,)")
          .gradient_of(bias_act_decl(), {"x", "bias"});
  return decl;
}

}  // namespace shapes
