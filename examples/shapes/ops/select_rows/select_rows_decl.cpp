// The contract of shapes::select_rows, written once: the torch schema and checks, the ORT registration
// (types, attributes, shape inference), the fake kernel (an unbacked size for "?"), the ONNX OpSchema
// and both exporters' rules are all derived from this declaration. No gradient.
#include "select_rows.h"

namespace shapes {

SelectRowsParams select_rows_params(const opbridge::KernelCall& k) {
  const opbridge::TensorArg& x = k.arg("x");
  return {x.dim(0), x.dim(1), k.call().attr_float("threshold")};
}

const opbridge::OpDecl& select_rows_decl() {
  using namespace opbridge;
  static const OpDecl decl =
      OpDecl("select_rows", "SelectRows", 1)
          .doc("The rows of x whose largest element exceeds threshold, in order.")
          .input("x", "T", "input").shape("(N, D)").rank(2)
          .attr_float("threshold", 0.0, "a row is kept where its maximum is above this")
          .types("T", kFloat32And64)
          .output("y", "T", "?, x[1]", "(number of rows kept, D)");
  return decl;
}

}  // namespace shapes
