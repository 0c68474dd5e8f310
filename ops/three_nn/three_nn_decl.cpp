// The contract of ThreeNN (see group_norm_decl.cpp for what derives from it).
#include <string>

#include "opbridge/op_decl.h"
#include "opbridge/point_cloud_op.h"
#include "three_nn.h"

namespace opbridge {
namespace {

Status validate(const OpCall& call) {
  OPBRIDGE_RETURN_IF_ERROR(point_cloud::check_cloud_pair(call, "target", "source"));
  const TensorArg& s = call.in("source");
  if (s.known(1) && s.dim(1) < 3) {
    return Status::InvalidArgument("source must hold at least 3 points (M >= 3), got source.shape[1] = " +
                                   std::to_string(s.dim(1)));
  }
  return Status::Ok();
}

}  // namespace

ThreeNNParams three_nn_params(const KernelCall& k) { return point_cloud::cloud_dims(k, "target", "source"); }

const OpDecl& three_nn_decl() {
  static const OpDecl decl =
      point_cloud::cloud_pair_inputs(
          point_cloud::op_decl("three_nn", kThreeNNOpType,
                               "The three nearest source points of each target point (mmcv's three_nn): distances "
                               "ascending and their indices; ties to the lowest index."),
          "target", "the points to find neighbours for", "source", "the candidate neighbours, M >= 3")
          .output("dist", "T", "target", "(B, N, 3) distances, ascending")
          .output("indices", "I", "target", "(B, N, 3) int64 indices into M")
          .check(validate);
  return decl;
}

}  // namespace opbridge
