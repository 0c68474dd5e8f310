// The contracts of ThreeInterpolate and its backward (see group_norm_decl.cpp for what derives
// from them).
#include <string>

#include "opbridge/op_decl.h"
#include "opbridge/point_cloud_op.h"
#include "three_interpolate.h"

namespace opbridge {
namespace {

std::string shape_str(const TensorArg& a) {
  std::string s = "[";
  for (int64_t i = 0; i < a.rank(); ++i) s += (i ? ", " : "") + (a.known(i) ? std::to_string(a.dim(i)) : "?");
  return s + "]";
}

Status validate(const OpCall& call) {
  const TensorArg &f = call.in("features"), &i = call.in("indices"), &w = call.in("weight");
  if (i.known(2) && i.dim(2) != 3) {
    return Status::InvalidArgument("indices must have shape (B, N, 3), got shape " + shape_str(i));
  }
  if (f.known(0) && i.known(0) && f.dim(0) != i.dim(0)) {
    return Status::InvalidArgument("indices must have B = features.shape[0] = " + std::to_string(f.dim(0)) +
                                   " rows, got shape " + shape_str(i));
  }
  for (int a = 0; a < 3; ++a) {
    if (w.known(a) && i.known(a) && w.dim(a) != i.dim(a)) {
      return Status::InvalidArgument("weight must have the shape of indices " + shape_str(i) + ", got shape " +
                                     shape_str(w));
    }
  }
  if (f.known(2) && f.dim(2) == 0 && i.known(1) && i.dim(1) > 0 && f.known(1) && f.dim(1) > 0) {
    return Status::InvalidArgument("features must have M >= 1 points to interpolate from, got features.shape[2] = 0");
  }
  return Status::Ok();
}

}  // namespace

ThreeInterpolateDims three_interpolate_dims(const KernelCall& k) {
  const TensorArg &f = k.arg("features"), &i = k.arg("indices");
  return {f.dim(0), f.dim(1), f.dim(2), i.dim(1)};
}

const OpDecl& three_interpolate_decl() {
  static const OpDecl decl =
      point_cloud::op_decl("three_interpolate", kThreeInterpolateOpType,
                           "Weighted sum of three features per point (mmcv's three_interpolate): "
                           "out[b, c, n] = sum over j of weight[b, n, j] * features[b, c, indices[b, n, j]].",
                           {ElemType::kInt64, ElemType::kInt32})
          .input("features", "T", "features of the source points").shape("(B, C, M)").rank(3)
          .input("indices", "I", "three source indices per target point, in [0, M)").shape("(B, N, 3)").rank(3)
          .input("weight", "T", "their weights").shape("(B, N, 3)").rank(3)
          .output("output", "T", "features[0], features[1], indices[1]", "(B, C, N)")
          .check(validate);
  return decl;
}

const OpDecl& three_interpolate_backward_decl() {
  static const OpDecl decl =
      point_cloud::backward_decl(three_interpolate_decl(),
                                 "Gradients of ThreeInterpolate with respect to features and weight.", "(B, C, N)")
          .output("grad_weight", "T", "weight", "shape of weight")
          .gradient_of(three_interpolate_decl(), {"features", "weight"});
  return decl;
}

}  // namespace opbridge
