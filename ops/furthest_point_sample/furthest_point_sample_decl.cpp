// The contract of FurthestPointSample (see group_norm_decl.cpp for what derives from it).
#include <string>

#include "furthest_point_sample.h"
#include "opbridge/op_decl.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge {
namespace {

Status validate(const OpCall& call) {
  const TensorArg& p = call.in("points_xyz");
  OPBRIDGE_RETURN_IF_ERROR(point_cloud::check_xyz(p, "points_xyz", "(B, N, 3)"));
  const int64_t m = call.attr_int("num_points");
  if (m < 0) return Status::InvalidArgument("num_points must be >= 0, got " + std::to_string(m));
  if (p.known(1) && m > p.dim(1)) {
    return Status::InvalidArgument("num_points must be <= N = points_xyz.shape[1] = " + std::to_string(p.dim(1)) +
                                   ", got num_points = " + std::to_string(m));
  }
  return Status::Ok();
}

}  // namespace

FurthestPointSampleParams furthest_point_sample_params(const KernelCall& k) {
  return {k.arg("points_xyz").dim(0), k.arg("points_xyz").dim(1), k.call().attr_int("num_points")};
}

const OpDecl& furthest_point_sample_decl() {
  static const OpDecl decl =
      point_cloud::cloud_input(
          point_cloud::op_decl("furthest_point_sample", kFurthestPointSampleOpType,
                               "Farthest point sampling (PointNet++, mmcv's furthest_point_sample): num_points "
                               "indices per cloud, the first 0, each next one the point farthest from those picked; "
                               "ties to the lowest index."),
          "points_xyz", "the point clouds", "(B, N, 3)")
          .attr_int("num_points", "number of points to sample, M <= N").required()
          .output("indices", "I", "points_xyz[0], num_points", "(B, M) int64 indices into N")
          .check(validate);
  return decl;
}

}  // namespace opbridge
