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
  const ArrayArg xa{x, dtype_of_array(x, op, "x")};
  const DType dt = xa.dtype;
  OpCall call(inverse_decl());
  call.in("x") = tensor_arg(&xa);
  call.set_string("on_singular", on_singular);
  check(check_call(call), op);
  const bool nan_on_singular = on_singular == "nan";
  const auto shape = shape_of(x);
  const InverseDims d = inverse_dims(shape);
  const int64_t batch = d.batch, n = d.n;
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
