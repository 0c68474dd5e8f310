// opbridge._core.inverse: the Inverse CPU kernel on numpy arrays (serial), with a choice of
// instruction-set variant so that tests can check each one.
#include <string>

#include <nanobind/stl/string.h>

#include "core_module.h"
#include "opbridge/inverse.h"

namespace opbridge::py {
namespace {

CpuIsa parse_isa(const std::string& isa) {
  CpuIsa v;
  if (!parse_cpu_isa(isa.c_str(), &v)) {
    throw nb::value_error(
        ("inverse: isa must be 'auto', 'baseline', 'avx2' or 'avx512', got '" + isa + "'").c_str());
  }
  return v;
}

OutArray inverse_py(const InArray& x, const std::string& isa, const std::string& on_singular) {
  constexpr const char* op = "inverse";
  const CpuIsa variant = parse_isa(isa);
  bool nan_on_singular = false;
  check(inverse_parse_on_singular(on_singular.c_str(), &nan_on_singular), op);
  const DType dt = dtype_of_array(x, op, "x");
  if (dt != DType::kFloat32 && dt != DType::kFloat64) throw nb::type_error("inverse: x must be float32 or float64");
  const auto shape = shape_of(x);
  const int64_t r = static_cast<int64_t>(shape.size());
  check(inverse_check(r, r >= 2 ? shape[r - 2] : 0, r >= 1 ? shape[r - 1] : 0), op);
  const int64_t n = shape[r - 1];
  // An empty x has no matrices; only then could n * n overflow (x = [0, 2^32, 2^32] made it 0).
  const int64_t batch = x.size() == 0 ? 0 : static_cast<int64_t>(x.size()) / (n * n);
  void* out = nullptr;
  OutArray y = new_array(dt, shape, &out);
  const Status st = dt == DType::kFloat32
                        ? inverse_cpu<float>(static_cast<const float*>(x.data()), static_cast<float*>(out), batch, n,
                                             ParallelFor(), variant, nan_on_singular)
                        : inverse_cpu<double>(static_cast<const double*>(x.data()), static_cast<double*>(out), batch,
                                              n, ParallelFor(), variant, nan_on_singular);
  check(st, op);
  return y;
}

void bind(nb::module_& m) {
  m.def("inverse", &inverse_py, nb::arg("x"), nb::arg("isa") = "auto", nb::arg("on_singular") = "raise",
        "Inverse of each matrix of x (*, n, n), computed by opbridge's CPU kernel (isa: 'auto', 'baseline', "
        "'avx2' or 'avx512', the instruction-set variant; on_singular: 'raise' (RuntimeError naming the "
        "first singular matrix) or 'nan' (its output is NaN, the others are computed)).");
}

}  // namespace
}  // namespace opbridge::py

OPBRIDGE_REGISTER_PY(opbridge::py::bind);
