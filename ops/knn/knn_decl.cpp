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
  return {point_cloud::cloud_dims(k, "xyz", "center_xyz"), k.call().attr_int("k")};
}

const OpDecl& knn_decl() {
  static const OpDecl decl =
      point_cloud::cloud_pair_inputs(
          point_cloud::op_decl("knn", kKnnOpType,
                               "The k nearest points of each center (mmcv's knn), nearest first; ties to the lowest "
                               "index.")
              .attr_int("k", "neighbours per center, 1 <= k <= N").required(),
          "xyz", "the points", "center_xyz", "the query centers")
          .output("indices", "I", "xyz[0], k, center_xyz[1]", "(B, k, M) int64 indices into N, nearest first")
          .check(validate);
  return decl;
}

}  // namespace opbridge
