// The contract of LogCumSumExp, written once: torch schema and checks, ORT registration (types,
// the axis attribute, shape inference), fake kernel, ONNX OpSchema and both exporters' rules.
#include <string>

#include "log_cumsum_exp.h"

namespace userops {
namespace {

using opbridge::OpCall;
using opbridge::Status;

// Rank >= 1 is the generic check (min_rank); the axis must name one of x's dimensions.
Status validate(const OpCall& call) {
  const opbridge::TensorArg& x = call.in("x");
  const int64_t dim = call.attr_int("dim"), rank = x.rank();
  if (x.rank_known && (dim < -rank || dim >= rank)) {
    return Status::InvalidArgument("dim must be in [-" + std::to_string(rank) + ", " + std::to_string(rank) +
                                   ") for x of rank " + std::to_string(rank) + ", got " + std::to_string(dim));
  }
  return Status::Ok();
}

}  // namespace

ScanDims log_cumsum_exp_dims(const opbridge::KernelCall& k) {
  const opbridge::TensorArg& x = k.arg("x");
  const int64_t rank = x.rank();
  int64_t axis = k.call().attr_int("dim");
  if (axis < 0) axis += rank;
  ScanDims d;
  for (int64_t i = 0; i < axis; ++i) d.outer *= x.shape[i];
  d.len = x.shape[axis];
  for (int64_t i = axis + 1; i < rank; ++i) d.inner *= x.shape[i];
  return d;
}

const opbridge::OpDecl& log_cumsum_exp_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("log_cumsum_exp", "LogCumSumExp", 1)
          .doc("log(cumsum(exp(X), axis)), computed stably (a running maximum), like torch.logcumsumexp.")
          .input("x", "T", "input").onnx_name("X").shape("(*)").min_rank(1)
          .attr_int("dim", "the axis to scan; negative counts from the end").required().onnx_name("axis")
          .types("T", kFloat32And64)
          .output("Y", "T", "x", "shape of x")
          .check(validate);
  return decl;
}

}  // namespace userops
