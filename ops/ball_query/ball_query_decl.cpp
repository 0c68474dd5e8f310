// The contract of BallQuery (see group_norm_decl.cpp for what derives from it).
#include <string>

#include "ball_query.h"
#include "opbridge/op_decl.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge {
namespace {

std::string num(double v) { return shortest_double(v); }

Status validate(const OpCall& call) {
  const double lo = call.attr_float("min_radius"), hi = call.attr_float("max_radius");
  if (!(hi > 0)) return Status::InvalidArgument("max_radius must be > 0, got " + num(hi));
  if (!(lo >= 0 && lo < hi)) {
    return Status::InvalidArgument("min_radius must be >= 0 and < max_radius = " + num(hi) + ", got " + num(lo));
  }
  const int64_t s = call.attr_int("sample_num");
  if (s < 1) return Status::InvalidArgument("sample_num must be >= 1, got " + std::to_string(s));
  OPBRIDGE_RETURN_IF_ERROR(point_cloud::check_cloud_pair(call, "xyz", "center_xyz"));
  const TensorArg &xyz = call.in("xyz"), &c = call.in("center_xyz");
  if (xyz.known(1) && xyz.dim(1) == 0 && !(c.known(1) && c.dim(1) == 0) && !(xyz.known(0) && xyz.dim(0) == 0)) {
    return Status::InvalidArgument("xyz must hold at least one point (N >= 1) for its centers, got N = 0");
  }
  return Status::Ok();
}

}  // namespace

BallQueryParams ball_query_params(const KernelCall& k) {
  const OpCall& call = k.call();
  return {point_cloud::cloud_dims(k, "xyz", "center_xyz"), call.attr_int("sample_num"),
          static_cast<float>(call.attr_float("min_radius")), static_cast<float>(call.attr_float("max_radius"))};
}

const OpDecl& ball_query_decl() {
  static const OpDecl decl =
      point_cloud::cloud_pair_inputs(
          point_cloud::op_decl("ball_query", kBallQueryOpType,
                               "Ball query (PointNet++, mmcv's ball_query): for each center the first sample_num "
                               "points in the shell min_radius <= d < max_radius (or at distance 0), unfilled slots "
                               "repeating the first one found.")
              .attr_float("min_radius", "inner radius of the shell, >= 0").required()
              .attr_float("max_radius", "outer radius of the ball, > min_radius").required()
              .attr_int("sample_num", "points per center, >= 1").required(),
          "xyz", "the points", "center_xyz", "the query centers")
          .output("indices", "I", "center_xyz[0], center_xyz[1], sample_num", "(B, M, sample_num) int64 indices into N")
          .check(validate);
  return decl;
}

}  // namespace opbridge
