// The contract of index_ops::radius_neighbors, written once: the torch schema and checks, the ORT registration
// (types, attributes, shape inference), the fake kernel, the ONNX OpSchema, both exporters' rules
// and the autograd formula are all derived from these declarations.
#include <cmath>
#include <string>

#include "radius_neighbors.h"

namespace index_ops {
namespace {

using opbridge::OpCall;
using opbridge::Status;
using opbridge::TensorArg;

// The op's own checks, after the generic ones (types, ranks). Sizes may be unknown (-1) in shape
// inference and fake kernels: checks on them are skipped there and run again in the kernels.
Status validate(const OpCall& call) {
  const TensorArg& pts = call.in("points");
  const TensorArg& q = call.in("queries");
  if (pts.known(1) && q.known(1) && pts.dim(1) != q.dim(1)) {
    return Status::InvalidArgument("queries must have D = points.shape[1] = " + std::to_string(pts.dim(1)) +
                                   " coordinates, got " + std::to_string(q.dim(1)));
  }
  // radius is float32 here as in ONNX Runtime (opbridge rounds float attributes so everywhere).
  const double r = call.attr_float("radius");
  if (!(r > 0) || !std::isfinite(r)) return Status::InvalidArgument("radius must be finite and > 0, got " + std::to_string(r));
  if (call.attr_int("k") < 1) return Status::InvalidArgument("k must be >= 1, got " + std::to_string(call.attr_int("k")));
  return Status::Ok();
}

}  // namespace

RadiusNeighborsParams radius_neighbors_params(const opbridge::KernelCall& k) {
  const TensorArg& pts = k.arg("points");
  return {pts.dim(0), k.arg("queries").dim(0), pts.dim(1), k.call().attr_int("k"), k.call().attr_float("radius")};
}

const opbridge::OpDecl& radius_neighbors_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("radius_neighbors", "RadiusNeighbors", 1)
          .doc("indices[q] = the first k points (in index order) at distance < radius from queries[q], -1 where fewer.")
          .input("points", "T", "points to search").shape("(N, D)").rank(2)
          .input("queries", "T", "query points").shape("(M, D)").rank(2)
          .attr_float("radius", "distance below which a point is a neighbour, > 0").required()
          .attr_int("k", "most neighbours per query, >= 1").required()
          .types("T", kFloat32And64)
          .types("I", {ElemType::kInt64})  // one type, bound by no input: the output's fixed type
          .output("indices", "I", "queries[0], k", "(M, k) int64")
          .check(validate);
  return decl;
}

}  // namespace index_ops
