// opbridge._core.group_norm: the GroupNorm CPU kernel on numpy arrays (serial).
#include <optional>

#include <nanobind/stl/optional.h>

#include "core_module.h"
#include "opbridge/group_norm.h"

namespace opbridge::py {
namespace {

OutArray group_norm_py(const InArray& x, int64_t num_groups, std::optional<InArray> weight,
                       std::optional<InArray> bias, double eps) {
  constexpr const char* op = "group_norm";
  const DType dt = dtype_of_array(x, op, "x");
  const auto shape = shape_of(x);
  for (auto* p : {&weight, &bias}) {
    if (p->has_value() && dtype_of_array(**p, op, p == &weight ? "weight" : "bias") != dt)
      throw nb::type_error("group_norm: weight and bias must have the dtype of x");
  }
  check(group_norm_check(static_cast<int64_t>(shape.size()), shape.size() >= 2 ? shape[1] : 0, num_groups,
                         weight ? static_cast<int64_t>(weight->size()) : -1,
                         bias ? static_cast<int64_t>(bias->size()) : -1, eps),
        op);
  const int64_t N = shape[0], C = shape[1];
  // S = 0 for an empty x (the kernel then does nothing); only then could N * C overflow.
  const int64_t S = x.size() == 0 ? 0 : static_cast<int64_t>(x.size()) / (N * C);
  void* out = nullptr;
  OutArray y = new_array(dt, shape, &out);
  Status st;
  {
    // The kernel touches no Python objects: let other Python threads run meanwhile.
    nb::gil_scoped_release release;
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      st = group_norm_cpu<T>(static_cast<const T*>(x.data()), weight ? static_cast<const T*>(weight->data()) : nullptr,
                             bias ? static_cast<const T*>(bias->data()) : nullptr, static_cast<T*>(out), N, C, S,
                             num_groups, eps, nullptr, nullptr, ParallelFor());
    });
  }
  check(st, op);
  return y;
}

void bind(nb::module_& m) {
  m.def("group_norm", &group_norm_py, nb::arg("x"), nb::arg("num_groups"), nb::arg("weight") = nb::none(),
        nb::arg("bias") = nb::none(), nb::arg("eps") = 1e-5,
        "GroupNorm of x (N, C, *) with per-channel weight/bias, computed by opbridge's CPU kernel.");
}

}  // namespace
}  // namespace opbridge::py

OPBRIDGE_REGISTER_PY(opbridge::py::bind);
