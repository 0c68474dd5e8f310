// opbridge._core.group_norm: the GroupNorm CPU kernel on numpy arrays (serial); bfloat16 as
// ml_dtypes.bfloat16 arrays (or any bfloat16 DLPack producer, e.g. a torch tensor).
#include <optional>
#include <string>
#include <vector>

#include <nanobind/stl/string.h>

#include "core_module.h"
#include "opbridge/group_norm.h"

namespace opbridge::py {
namespace {

nb::object group_norm_py(nb::handle x_obj, int64_t num_groups, nb::handle weight_obj, nb::handle bias_obj,
                         double eps, const std::string& activation, bool channels_last, bool return_stats) {
  constexpr const char* op = "group_norm";
  const ArrayArg x = array_arg(x_obj, op, "x");
  const DType dt = x.dtype;
  const auto shape = shape_of(x.array);
  std::optional<ArrayArg> weight, bias;
  if (!weight_obj.is_none()) weight = array_arg(weight_obj, op, "weight");
  if (!bias_obj.is_none()) bias = array_arg(bias_obj, op, "bias");
  // The logical (N, C, *spatial) shape: a channels-last array is (N, *spatial, C).
  std::vector<int64_t> logical = shape;
  if (channels_last && shape.size() >= 2) {
    logical = {shape.front(), shape.back()};
    logical.insert(logical.end(), shape.begin() + 1, shape.end() - 1);
  }
  OpCall call(group_norm_decl());
  call.in("x") = tensor_arg(&x);
  call.in("x").shape = logical;
  call.in("weight") = tensor_arg(weight ? &*weight : nullptr);
  call.in("bias") = tensor_arg(bias ? &*bias : nullptr);
  call.set_int("num_groups", num_groups);
  call.set_float("eps", eps);
  call.set_string("activation", activation);
  check(check_call(call), op);
  const Activation act = activation_from_name(activation);
  const GroupNormDims d = group_norm_dims(logical.data(), logical.size(), num_groups, channels_last);
  void* out = nullptr;
  OutArray y = new_array(dt, shape, &out);
  // The statistics, [N, G] in the accumulation type (float64 for float64 x, float32 otherwise).
  const DType acc = dt == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  void* mean_out = nullptr;
  void* rstd_out = nullptr;
  OutArray mean, rstd;
  if (return_stats) {
    // An empty x may have an astronomical N (x = [2^62, 1, 0] is valid): its statistics may not fit.
    int64_t bytes = 0;
    if (__builtin_mul_overflow(logical.front(), num_groups, &bytes) || __builtin_mul_overflow(bytes, int64_t{8}, &bytes)) {
      throw nb::value_error("group_norm: return_stats=True: N * num_groups statistics do not fit in memory");
    }
    const std::vector<int64_t> stats_shape = {logical.front(), num_groups};
    mean = new_array(acc, stats_shape, &mean_out);
    rstd = new_array(acc, stats_shape, &rstd_out);
  }
  Status st;
  {
    // The kernel touches no Python objects: let other Python threads run meanwhile.
    nb::gil_scoped_release release;
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      st = group_norm_cpu<T>(static_cast<const T*>(x.array.data()),
                             weight ? static_cast<const T*>(weight->array.data()) : nullptr,
                             bias ? static_cast<const T*>(bias->array.data()) : nullptr, static_cast<T*>(out), d, eps,
                             act, static_cast<acc_t<T>*>(mean_out), static_cast<acc_t<T>*>(rstd_out), ParallelFor());
    });
  }
  check(st, op);
  if (!return_stats) return to_python(y, dt);
  return nb::make_tuple(to_python(y, dt), to_python(mean, acc), to_python(rstd, acc));
}

void bind(nb::module_& m) {
  m.def("group_norm", &group_norm_py, nb::arg("x"), nb::arg("num_groups"), nb::arg("weight") = nb::none(),
        nb::arg("bias") = nb::none(), nb::arg("eps") = 1e-5, nb::arg("activation") = "none",
        nb::arg("channels_last") = false, nb::arg("return_stats") = false,
        "GroupNorm of x (N, C, *) with per-channel weight/bias and activation ('none' or 'silu'), computed by "
        "opbridge's CPU kernel. channels_last=True: x is (N, *spatial, C) (NHWC) and so is the result. "
        "return_stats=True: returns (y, mean, rstd), each group's mean and 1/sqrt(var + eps) as (N, num_groups) "
        "arrays in the accumulation type (float64 for float64 x, float32 otherwise; 0 for empty groups).");
}

}  // namespace
}  // namespace opbridge::py

OPBRIDGE_REGISTER_PY(opbridge::py::bind);
