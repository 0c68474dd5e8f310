// Output rules of opbridge declarations (opbridge/op_decl.h) read and evaluated, for
// tests/declarations/test_shape_rules.py. Usage: shape_rules RULE [X_DIM ...] [k=K] [stride=S]: declares an op
// with inputs x and y, int attributes k (default 2) and stride (1), a float attribute eps, and one
// output with RULE; prints the declaration error, or the rule's postfix form, then the check's
// verdict or the output's dimensions, for x of the dims given (-1: unknown) and y of shape (3, 5).
// "fn:RULE" gives the op an OutputShapeFn as well. "kernel=D,D,..." also prints whether the output
// is one its kernel sizes ('?') and the verdict on a kernel that gives it shape (D, D, ...), alone
// and as the adapters' bookkeeping (KernelSizedOutputs) gives it.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <opbridge/kernel.h>
#include <opbridge/op_decl.h>

int main(int argc, char** argv) {
  using namespace opbridge;
  if (argc < 2) return 2;
  std::vector<int64_t> x_dims;
  int64_t k = 2, stride = 1;
  bool kernel = false;
  std::vector<int64_t> kernel_dims;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("kernel=", 0) == 0) {
      kernel = true;
      for (size_t p = 7; p < a.size();) {
        const size_t comma = a.find(',', p);
        kernel_dims.push_back(std::atoll(a.substr(p, comma - p).c_str()));
        p = comma == std::string::npos ? a.size() : comma + 1;
      }
    } else if (a.rfind("k=", 0) == 0) {
      k = std::atoll(a.c_str() + 2);
    } else if (a.rfind("stride=", 0) == 0) {
      stride = std::atoll(a.c_str() + 7);
    } else {
      x_dims.push_back(std::atoll(a.c_str()));
    }
  }
  // "fn:RULE": the output's shape comes from an OutputShapeFn (x[0] * 10, x[-1]) instead of RULE.
  const bool use_fn = std::string(argv[1]).rfind("fn:", 0) == 0;
  OpDecl decl = OpDecl("probe", "Probe", 1)
                          .input("x", "T")
                          .input("y", "T")
                          .attr_int("k", 2)
                          .attr_int("stride", 1)
                          .attr_float("eps", 1e-5)
                          .types("T", {ElemType::kFloat32})
                          .output("out", "T", argv[1] + (use_fn ? 3 : 0));
  if (use_fn) {
    decl.output_shape_fn([](const OpCall& call, size_t) -> std::vector<int64_t> {
      const TensorArg& x = call.input(0);
      return {x.known(0) ? x.dim(0) * 10 : -1, x.dim(-1)};
    });
  }
  if (!decl.error().empty()) {
    std::printf("declaration error: %s\n", decl.error().c_str());
    return 0;
  }
  std::printf("postfix:");  // per dimension: kind,a,b steps, dimensions separated by |
  for (const auto& expr : decl.outputs()[0].dims) {
    for (const DimTerm& t : expr) std::printf(" %d,%lld,%lld", static_cast<int>(t.kind), static_cast<long long>(t.a),
                                              static_cast<long long>(t.b));
    std::printf(" |");
  }
  std::printf("\n");
  OpCall call(decl);
  call.input(0).present = call.input(1).present = true;
  call.input(0).type = call.input(1).type = ElemType::kFloat32;
  call.input(0).shape = x_dims;
  call.input(1).shape = {3, 5};
  call.attr(0).i = k;
  call.attr(1).i = stride;
  const Status s = check_call(call);
  if (!s.ok()) {
    std::printf("call error: %s\n", s.message().c_str());
    return 0;
  }
  std::printf("shape:");
  for (int64_t d : output_shape(call, 0)) std::printf(" %lld", static_cast<long long>(d));
  std::printf("\n");
  if (kernel) {
    std::printf("sized by kernel: %d\n", sized_by_kernel(decl, 0) ? 1 : 0);
    const std::string why = check_kernel_shape(decl, 0, output_shape(call, 0), kernel_dims);
    std::printf("kernel shape: %s\n", why.empty() ? "ok" : why.c_str());
    // What the adapters do with it (KernelSizedOutputs): before, on and after the allocation.
    KernelSizedOutputs sized(call);
    const std::string before = sized.missing(), first = sized.allocate(0, kernel_dims);
    const std::string again = sized.allocate(0, kernel_dims), after = sized.missing();
    std::printf("missing before: %s\n", before.empty() ? "none" : before.c_str());
    std::printf("allocate: %s\n", first.empty() ? "ok" : first.c_str());
    std::printf("allocate again: %s\n", again.empty() ? "ok" : again.c_str());
    std::printf("missing after: %s\n", after.empty() ? "none" : after.c_str());
  }
  return 0;
}
