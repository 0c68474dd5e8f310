// The contracts of GroupingOperation, GatherPoints and their backwards (see group_norm_decl.cpp
// for what derives from them).
#include <string>

#include "grouping_operation.h"
#include "opbridge/op_decl.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge {
namespace {

Status validate(const OpCall& call) {
  const TensorArg &f = call.in("features"), &i = call.in("indices");
  OPBRIDGE_RETURN_IF_ERROR(point_cloud::check_same_batch(f, "features", i, "indices", "rows"));
  const bool gathers = i.rank() > 0 && i.numel() != 0;
  if (f.known(2) && f.dim(2) == 0 && gathers && f.known(1) && f.dim(1) > 0) {
    return Status::InvalidArgument("features must have N >= 1 points to gather from, got features.shape[2] = 0");
  }
  return Status::Ok();
}

// GroupingOperation and GatherPoints are one gather, by indices of shape (B, M, S) or (B, M).
OpDecl gather_decl(const char* name, const char* op_type, const char* doc, const char* indices_shape,
                   int64_t indices_rank, const char* output_rule, const char* output_doc) {
  return point_cloud::op_decl(name, op_type, doc, {ElemType::kInt64, ElemType::kInt32})
      .input("features", "T", "per-point features").shape("(B, C, N)").rank(3)
      .input("indices", "I", "point indices in [0, N)").shape(indices_shape).rank(indices_rank)
      .output("output", "T", output_rule, output_doc)
      .check(validate);
}

// The gradient with respect to features of `forward`, whose output is `out_shape`.
OpDecl gather_backward_decl(const OpDecl& forward, const char* out_shape) {
  return point_cloud::backward_decl(forward, "Gradient of " + forward.onnx_type() + " with respect to features.",
                                    out_shape)
      .gradient_of(forward, {"features"});
}

}  // namespace

GatherDims gather_dims(const KernelCall& k) {
  const TensorArg &f = k.arg("features"), &i = k.arg("indices");
  GatherDims d{f.dim(0), f.dim(1), f.dim(2), 1};
  for (int64_t a = 1; a < i.rank(); ++a) d.J *= i.dim(a);
  return d;
}

const OpDecl& grouping_operation_decl() {
  static const OpDecl decl = gather_decl(
      "grouping_operation", kGroupingOperationOpType,
      "Features gathered by groups of indices (PointNet++, mmcv's grouping_operation): "
      "out[b, c, m, s] = features[b, c, indices[b, m, s]].",
      "(B, M, S)", 3, "features[0], features[1], indices[1], indices[2]", "(B, C, M, S)");
  return decl;
}

const OpDecl& grouping_operation_backward_decl() {
  static const OpDecl decl = gather_backward_decl(grouping_operation_decl(), "(B, C, M, S)");
  return decl;
}

const OpDecl& gather_points_decl() {
  static const OpDecl decl = gather_decl(
      "gather_points", kGatherPointsOpType,
      "Features gathered by indices (mmcv's gather_points): out[b, c, m] = features[b, c, indices[b, m]].", "(B, M)",
      2, "features[0], features[1], indices[1]", "(B, C, M)");
  return decl;
}

const OpDecl& gather_points_backward_decl() {
  static const OpDecl decl = gather_backward_decl(gather_points_decl(), "(B, C, M)");
  return decl;
}

}  // namespace opbridge
