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

ThreeNNParams three_nn_params(const KernelCall& k) {
  return {k.arg("target").dim(0), k.arg("target").dim(1), k.arg("source").dim(1)};
}

const OpDecl& three_nn_decl() {
  static const OpDecl decl =
      OpDecl("three_nn", kThreeNNOpType, 3)
          .doc("The three nearest source points of each target point (mmcv's three_nn): distances ascending and "
               "their indices; ties to the lowest index.")
          .input("target", "T", "the points to find neighbours for").shape("(B, N, 3)").rank(3)
          .input("source", "T", "the candidate neighbours, M >= 3").shape("(B, M, 3)").rank(3)
          .types("T", kFloatTypes)
          .types("I", {ElemType::kInt64})
          .output("dist", "T", "target", "(B, N, 3) distances, ascending")
          .output("indices", "I", "target", "(B, N, 3) int64 indices into M")
          .check(validate);
  return decl;
}

}  // namespace opbridge
