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
  const TensorArg &xyz = k.arg("xyz"), &c = k.arg("center_xyz");
  BallQueryParams p;
  p.B = xyz.dim(0);
  p.N = xyz.dim(1);
  p.M = c.dim(1);
  p.S = k.call().attr_int("sample_num");
  p.min_radius = static_cast<float>(k.call().attr_float("min_radius"));
  p.max_radius = static_cast<float>(k.call().attr_float("max_radius"));
  return p;
}

const OpDecl& ball_query_decl() {
  static const OpDecl decl =
      OpDecl("ball_query", kBallQueryOpType, 3)
          .doc("Ball query (PointNet++, mmcv's ball_query): for each center the first sample_num points in the shell "
               "min_radius <= d < max_radius (or at distance 0), unfilled slots repeating the first one found.")
          .attr_float("min_radius", "inner radius of the shell, >= 0").required()
          .attr_float("max_radius", "outer radius of the ball, > min_radius").required()
          .attr_int("sample_num", "points per center, >= 1").required()
          .input("xyz", "T", "the points").shape("(B, N, 3)").rank(3)
          .input("center_xyz", "T", "the query centers").shape("(B, M, 3)").rank(3)
          .types("T", kFloatTypes)
          .types("I", {ElemType::kInt64})
          .output("indices", "I", "center_xyz[0], center_xyz[1], sample_num", "(B, M, sample_num) int64 indices into N")
          .check(validate);
  return decl;
}

}  // namespace opbridge
