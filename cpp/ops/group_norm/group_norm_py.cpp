// opbridge._core.group_norm: the GroupNorm CPU kernel on numpy arrays (serial); bfloat16 as
// ml_dtypes.bfloat16 arrays (or any bfloat16 DLPack producer, e.g. a torch tensor).
#include <optional>

#include "core_module.h"
#include "opbridge/group_norm.h"

namespace opbridge::py {
namespace {

nb::object group_norm_py(nb::handle x_obj, int64_t num_groups, nb::handle weight_obj, nb::handle bias_obj,
                         double eps) {
  constexpr const char* op = "group_norm";
  const ArrayArg x = array_arg(x_obj, op, "x");
  const DType dt = x.dtype;
  const auto shape = shape_of(x.array);
  std::optional<ArrayArg> weight, bias;
  if (!weight_obj.is_none()) weight = array_arg(weight_obj, op, "weight");
  if (!bias_obj.is_none()) bias = array_arg(bias_obj, op, "bias");
  OpCall call(group_norm_decl());
  call.in("x") = tensor_arg(&x);
  call.in("weight") = tensor_arg(weight ? &*weight : nullptr);
  call.in("bias") = tensor_arg(bias ? &*bias : nullptr);
  call.set_int("num_groups", num_groups);
  call.set_float("eps", eps);
  check(check_call(call), op);
  const GroupNormDims d = group_norm_dims(shape, num_groups);
  void* out = nullptr;
  OutArray y = new_array(dt, shape, &out);
  Status st;
  {
    // The kernel touches no Python objects: let other Python threads run meanwhile.
    nb::gil_scoped_release release;
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      st = group_norm_cpu<T>(static_cast<const T*>(x.array.data()),
                             weight ? static_cast<const T*>(weight->array.data()) : nullptr,
                             bias ? static_cast<const T*>(bias->array.data()) : nullptr, static_cast<T*>(out), d.N, d.C,
                             d.S, d.G, eps, nullptr, nullptr, ParallelFor());
    });
  }
  check(st, op);
  return to_python(y, dt);
}

void bind(nb::module_& m) {
  m.def("group_norm", &group_norm_py, nb::arg("x"), nb::arg("num_groups"), nb::arg("weight") = nb::none(),
        nb::arg("bias") = nb::none(), nb::arg("eps") = 1e-5,
        "GroupNorm of x (N, C, *) with per-channel weight/bias, computed by opbridge's CPU kernel.");
}

}  // namespace
}  // namespace opbridge::py

OPBRIDGE_REGISTER_PY(opbridge::py::bind);
