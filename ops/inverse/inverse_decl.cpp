// The contract of Inverse, written once (see group_norm_decl.cpp for what derives from it), and
// the kernels' arguments from a checked call.
#include <string>

#include "inverse.h"
#include "opbridge/op_decl.h"

namespace opbridge {
namespace {

Status validate(const OpCall& call) {
  const TensorArg& x = call.in("x");
  if (x.known(-2) && x.known(-1) && x.dim(-2) != x.dim(-1)) {
    return Status::InvalidArgument("x must hold square matrices (*, n, n), got matrices of shape (" +
                                   std::to_string(x.dim(-2)) + ", " + std::to_string(x.dim(-1)) + ")");
  }
  return Status::Ok();
}

}  // namespace

InverseDims inverse_dims(const std::vector<int64_t>& shape) {
  InverseDims d;
  d.n = shape.back();
  for (int64_t s : shape) {
    if (s == 0) return d;  // batch = 0
  }
  d.batch = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) d.batch *= shape[i];  // <= numel: no overflow
  return d;
}

InverseParams inverse_params(const KernelCall& k) {
  InverseParams p;
  p.d = inverse_dims(k.arg("x").shape);
  p.nan_on_singular = k.call().attr_string("on_singular") == "nan";
  return p;
}

const OpDecl& inverse_decl() {
  static const OpDecl decl =
      OpDecl("inverse", kInverseOpType, 1)
          .doc("Inverse of each square matrix of X (semantics of torch.linalg.inv).")
          .input("x", "T", "a batch of square matrices").onnx_name("X").shape("(a batch of square matrices, shape (*, n, n))")
          .min_rank(2)
          .attr_string("on_singular", "raise",
                       "a singular matrix is an error (raise) or gives a NaN matrix, the others being computed (nan)")
          .choices({"raise", "nan"}).since(2)
          .types("T", kFloat32And64)
          .output("Y", "T", "x", "the inverses, shape of x")
          .check(validate);
  return decl;
}

}  // namespace opbridge
