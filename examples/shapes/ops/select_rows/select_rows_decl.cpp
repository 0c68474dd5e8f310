// The contract of shapes::select_rows, written once: the torch schema and checks, the ORT registration
// (types, attributes, shape inference), the fake kernel, the ONNX OpSchema and both exporters'
// rules are all derived from these declarations and their validation.
#include <string>

#include "select_rows.h"

namespace shapes {

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
