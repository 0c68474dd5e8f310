// The contracts of GroupingOperation, GatherPoints and their backwards (see group_norm_decl.cpp
// for what derives from them).
#include <string>

#include "grouping_operation.h"
#include "opbridge/op_decl.h"

namespace opbridge {
namespace {

Status validate(const OpCall& call) {
  const TensorArg &f = call.in("features"), &i = call.in("indices");
  if (f.known(0) && i.known(0) && f.dim(0) != i.dim(0)) {
    return Status::InvalidArgument("indices must have B = features.shape[0] = " + std::to_string(f.dim(0)) +
                                   " rows, got indices.shape[0] = " + std::to_string(i.dim(0)));
  }
  const bool gathers = i.rank() > 0 && i.numel() != 0;
  if (f.known(2) && f.dim(2) == 0 && gathers && f.known(1) && f.dim(1) > 0) {
    return Status::InvalidArgument("features must have N >= 1 points to gather from, got features.shape[2] = 0");
  }
  return Status::Ok();
}

}  // namespace

GatherDims gather_dims(const KernelCall& k) {
  const TensorArg &f = k.arg("features"), &i = k.arg("indices");
  GatherDims d{f.dim(0), f.dim(1), f.dim(2), 1};
  for (int64_t a = 1; a < i.rank(); ++a) d.J *= i.dim(a);
  return d;
}

const OpDecl& grouping_operation_decl() {
  static const OpDecl decl =
      OpDecl("grouping_operation", kGroupingOperationOpType, 3)
          .doc("Features gathered by groups of indices (PointNet++, mmcv's grouping_operation): "
               "out[b, c, m, s] = features[b, c, indices[b, m, s]].")
          .input("features", "T", "per-point features").shape("(B, C, N)").rank(3)
          .input("indices", "I", "point indices in [0, N)").shape("(B, M, S)").rank(3)
          .types("T", kFloatTypes)
          .types("I", {ElemType::kInt64, ElemType::kInt32})
          .output("output", "T", "features[0], features[1], indices[1], indices[2]", "(B, C, M, S)")
          .check(validate);
  return decl;
}

const OpDecl& grouping_operation_backward_decl() {
  static const OpDecl decl =
      OpDecl("grouping_operation_backward", "GroupingOperationBackward", 3)
          .doc("Gradient of GroupingOperation with respect to features.")
          .input("grad_output", "T", "gradient of the output").shape("(B, C, M, S)")
          .args_of(grouping_operation_decl())
          .output("grad_features", "T", "features", "shape of features")
          .gradient_of(grouping_operation_decl(), {"features"});
  return decl;
}

const OpDecl& gather_points_decl() {
  static const OpDecl decl =
      OpDecl("gather_points", kGatherPointsOpType, 3)
          .doc("Features gathered by indices (mmcv's gather_points): out[b, c, m] = features[b, c, indices[b, m]].")
          .input("features", "T", "per-point features").shape("(B, C, N)").rank(3)
          .input("indices", "I", "point indices in [0, N)").shape("(B, M)").rank(2)
          .types("T", kFloatTypes)
          .types("I", {ElemType::kInt64, ElemType::kInt32})
          .output("output", "T", "features[0], features[1], indices[1]", "(B, C, M)")
          .check(validate);
  return decl;
}

const OpDecl& gather_points_backward_decl() {
  static const OpDecl decl =
      OpDecl("gather_points_backward", "GatherPointsBackward", 3)
          .doc("Gradient of GatherPoints with respect to features.")
          .input("grad_output", "T", "gradient of the output").shape("(B, C, M)")
          .args_of(gather_points_decl())
          .output("grad_features", "T", "features", "shape of features")
          .gradient_of(gather_points_decl(), {"features"});
  return decl;
}

}  // namespace opbridge
