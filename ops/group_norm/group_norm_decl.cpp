// The contract of GroupNorm, written once: torch (opbridge::group_norm), ONNX
// (ai.opbridge::GroupNorm), ORT shape inference, the fake kernel, the OpSchema and the exporters
// are all derived from this declaration and its validation; so is its backward's. The kernels'
// arguments come from a checked call through group_norm_params, the one place that reads the
// call for them (the compute functions: group_norm_cpu.cpp, group_norm_kernel.cu).
#include <cmath>
#include <string>

#include "group_norm.h"
#include "opbridge/op_decl.h"

namespace opbridge {
namespace {

Status validate(const OpCall& call) {
  const TensorArg& x = call.in("x");
  const int64_t groups = call.attr_int("num_groups");
  if (groups <= 0) return Status::InvalidArgument("num_groups must be > 0, got " + std::to_string(groups));
  const int64_t channels = x.dim(1);
  if (channels >= 0 && channels % groups != 0) {
    return Status::InvalidArgument("num_groups must divide the number of channels C = x.shape[1] = " +
                                   std::to_string(channels) + ", got num_groups = " + std::to_string(groups));
  }
  for (const char* name : {"weight", "bias"}) {
    const TensorArg& p = call.in(name);
    if (!p.present || !p.rank_known) continue;
    if (p.rank() != 1) {
      std::string shape = "[";
      for (int64_t i = 0; i < p.rank(); ++i) shape += (i ? ", " : "") + std::to_string(p.shape[i]);
      return Status::InvalidArgument(std::string(name) + " must be 1-D (one value per channel), got shape " +
                                     shape + "]");
    }
    if (channels >= 0 && p.known(0) && p.dim(0) != channels) {
      return Status::InvalidArgument(std::string(name) + " must have C = " + std::to_string(channels) +
                                     " elements (one per channel), got " + std::to_string(p.dim(0)));
    }
  }
  const double eps = call.attr_float("eps");
  if (!(eps >= 0.0) || !std::isfinite(eps)) {
    return Status::InvalidArgument("eps must be finite and >= 0, got " + std::to_string(eps));
  }
  return Status::Ok();
}

}  // namespace

GroupNormParams group_norm_params(const KernelCall& k) {
  const OpCall& call = k.call();
  const TensorArg& x = call.in("x");
  GroupNormParams p;
  p.d = group_norm_dims(x.shape, call.attr_int("num_groups"), k.channels_last());
  p.eps = call.attr_float("eps");
  p.act = activation_from_name(call.attr_string("activation"));
  return p;
}

const OpDecl& group_norm_decl() {
  static const OpDecl decl =
      OpDecl("group_norm", kGroupNormOpType, 1)
          .doc("Group normalization with per-channel scale and bias (semantics of "
               "torch.nn.functional.group_norm and ONNX GroupNormalization-21), optionally followed by an "
               "activation.")
          .input("x", "T", "input").onnx_name("X").shape("(N, C, *)").min_rank(2)
          .attr_int("num_groups", "number of groups; divides C").required()
          .input("weight", "T", "per-channel scale (1 when absent)").shape("(C,)").optional().onnx_name("scale")
          .input("bias", "T", "per-channel shift (0 when absent)").shape("(C,)").optional()
          .attr_float("eps", 1e-5, "added to the variance").onnx_name("epsilon")
          .attr_string("activation", "none", "applied after the affine: none or silu (x * sigmoid(x))")
          .choices({"none", "silu"}).since(2)
          .types("T", kFloatTypes)
          .output("Y", "T", "x", "shape and memory format of x").keeps_memory_format()
          .check(validate);
  return decl;
}

const OpDecl& group_norm_backward_decl() {
  static const OpDecl decl =
      OpDecl("group_norm_backward", "GroupNormBackward", 1)
          .doc("Gradients of GroupNorm with respect to x, weight and bias (the latter two as if weight were 1 where "
               "it is absent), given the gradient of Y.")
          .input("grad", "T", "gradient of Y").shape("(N, C, *), the shape of x")
          .args_of(group_norm_decl())
          .output("grad_x", "T", "x", "shape and memory format of x").keeps_memory_format()
          .output("grad_weight", "T", "x[1]", "(C,)")
          .output("grad_bias", "T", "x[1]", "(C,)")
          .gradient_of(group_norm_decl(), {"x", "weight", "bias"});
  return decl;
}

}  // namespace opbridge
