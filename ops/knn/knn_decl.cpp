// The contract of KNN (see group_norm_decl.cpp for what derives from it).
#include <string>

#include "knn.h"
#include "opbridge/op_decl.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge {
namespace {

Status validate(const OpCall& call) {
  OPBRIDGE_RETURN_IF_ERROR(point_cloud::check_cloud_pair(call, "xyz", "center_xyz"));
  const TensorArg& xyz = call.in("xyz");
  const int64_t k = call.attr_int("k");
  if (k < 1) return Status::InvalidArgument("k must be >= 1, got " + std::to_string(k));
  if (xyz.known(1) && k > xyz.dim(1)) {
    return Status::InvalidArgument("k must be <= N = xyz.shape[1] = " + std::to_string(xyz.dim(1)) + ", got k = " +
                                   std::to_string(k));
  }
  return Status::Ok();
}

}  // namespace

KnnParams knn_params(const KernelCall& k) {
  return {k.arg("xyz").dim(0), k.arg("xyz").dim(1), k.arg("center_xyz").dim(1), k.call().attr_int("k")};
}

const OpDecl& knn_decl() {
  static const OpDecl decl =
      OpDecl("knn", kKnnOpType, 3)
          .doc("The k nearest points of each center (mmcv's knn), nearest first; ties to the lowest index.")
          .attr_int("k", "neighbours per center, 1 <= k <= N").required()
          .input("xyz", "T", "the points").shape("(B, N, 3)").rank(3)
          .input("center_xyz", "T", "the query centers").shape("(B, M, 3)").rank(3)
          .types("T", kFloatTypes)
          .types("I", {ElemType::kInt64})
          .output("indices", "I", "xyz[0], k, center_xyz[1]", "(B, k, M) int64 indices into N, nearest first")
          .check(validate);
  return decl;
}

}  // namespace opbridge
