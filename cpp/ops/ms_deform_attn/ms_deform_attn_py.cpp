// opbridge._core.ms_deform_attn / ms_deform_attn_backward: the MultiScaleDeformableAttention
// CPU kernels on numpy arrays (serial), with a choice of instruction-set variant so that tests
// can check each one. bfloat16 as ml_dtypes.bfloat16 arrays (or any bfloat16 DLPack producer).
#include <string>
#include <vector>

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include "core_module.h"
#include "opbridge/ms_deform_attn.h"

namespace opbridge::py {
namespace {

constexpr const char* kOp = "ms_deform_attn";

// An array argument of any element type, with its type's name for ms_deform_attn_check: the
// check, not the binding, decides which types are acceptable (same messages as torch and ORT).
struct AnyArray {
  InArray array;
  std::string dtype;
  std::vector<int64_t> shape;
  MsDeformAttnArg arg() const { return {shape.data(), static_cast<int64_t>(shape.size()), dtype.c_str()}; }
};

std::string type_name(const InArray& a) {
  const auto d = a.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(d.code);
  const std::string bits = std::to_string(d.bits);
  switch (code) {
    case nb::dlpack::dtype_code::Float: return "float" + bits;
    case nb::dlpack::dtype_code::Bfloat: return "bfloat" + bits;
    case nb::dlpack::dtype_code::Int: return "int" + bits;
    case nb::dlpack::dtype_code::UInt: return "uint" + bits;
    case nb::dlpack::dtype_code::Bool: return "bool";
    case nb::dlpack::dtype_code::Complex: return "complex" + bits;
    default: return "unknown";
  }
}

AnyArray any_array(nb::handle obj, const char* name) {
  AnyArray out;
  const nb::module_ np = nb::module_::import_("numpy");
  if (nb::isinstance(obj, np.attr("ndarray")) && nb::str(obj.attr("dtype").attr("name")).equal(nb::str("bfloat16"))) {
    out.array = array_arg(obj, kOp, name).array;
    out.dtype = "bfloat16";
  } else {
    if (!nb::try_cast(obj, out.array)) {
      throw nb::type_error((std::string(kOp) + ": " + name + " must be an array (numpy, or anything with __dlpack__), got " +
                            nb::type_name(obj.type()).c_str())
                               .c_str());
    }
    out.dtype = type_name(out.array);
  }
  out.shape = shape_of(out.array);
  return out;
}

DType dtype_named(const std::string& name) {
  if (name == "float64") return DType::kFloat64;
  if (name == "float16") return DType::kFloat16;
  if (name == "bfloat16") return DType::kBFloat16;
  return DType::kFloat32;
}

CpuIsa parse_isa(const std::string& isa) {
  CpuIsa v;
  if (!parse_cpu_isa(isa.c_str(), &v)) {
    throw nb::value_error(
        (std::string(kOp) + ": isa must be 'auto', 'baseline', 'avx2' or 'avx512', got '" + isa + "'").c_str());
  }
  return v;
}

template <class T>
const T* data(const AnyArray& a) {
  return static_cast<const T*>(a.array.data());
}

nb::object forward_py(nb::handle value_obj, nb::handle shapes_obj, nb::handle starts_obj, nb::handle loc_obj,
                      nb::handle weights_obj, const std::string& isa) {
  const CpuIsa variant = parse_isa(isa);
  const AnyArray value = any_array(value_obj, "value"), shapes = any_array(shapes_obj, "spatial_shapes"),
                 starts = any_array(starts_obj, "level_start_index"), loc = any_array(loc_obj, "sampling_locations"),
                 weights = any_array(weights_obj, "attention_weights");
  const bool ints = shapes.dtype == "int64" && starts.dtype == "int64";
  MsDeformAttnDims d;
  check(ms_deform_attn_check(value.arg(), shapes.arg(), starts.arg(), loc.arg(), weights.arg(),
                             ints ? data<int64_t>(shapes) : nullptr, ints ? data<int64_t>(starts) : nullptr, nullptr,
                             &d),
        kOp);
  const DType dt = dtype_named(value.dtype);
  void* out = nullptr;
  OutArray y = new_array(dt, {d.N, d.Lq, d.M * d.D}, &out);
  Status st;
  {
    // The kernel touches no Python objects: let other Python threads run meanwhile.
    nb::gil_scoped_release release;
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      st = ms_deform_attn_cpu<T>(data<T>(value), data<int64_t>(shapes), data<int64_t>(starts), data<T>(loc),
                                 data<T>(weights), static_cast<T*>(out), d, ParallelFor(), variant);
    });
  }
  check(st, kOp);
  return to_python(y, dt);
}

std::tuple<nb::object, nb::object, nb::object> backward_py(nb::handle grad_obj, nb::handle value_obj,
                                                           nb::handle shapes_obj, nb::handle starts_obj,
                                                           nb::handle loc_obj, nb::handle weights_obj,
                                                           const std::string& isa) {
  const CpuIsa variant = parse_isa(isa);
  const AnyArray grad = any_array(grad_obj, "grad_output"), value = any_array(value_obj, "value"),
                 shapes = any_array(shapes_obj, "spatial_shapes"), starts = any_array(starts_obj, "level_start_index"),
                 loc = any_array(loc_obj, "sampling_locations"), weights = any_array(weights_obj, "attention_weights");
  const bool ints = shapes.dtype == "int64" && starts.dtype == "int64";
  const MsDeformAttnArg grad_arg = grad.arg();
  MsDeformAttnDims d;
  check(ms_deform_attn_check(value.arg(), shapes.arg(), starts.arg(), loc.arg(), weights.arg(),
                             ints ? data<int64_t>(shapes) : nullptr, ints ? data<int64_t>(starts) : nullptr,
                             &grad_arg, &d),
        "ms_deform_attn_backward");
  const DType dt = dtype_named(value.dtype);
  void *gv = nullptr, *gl = nullptr, *ga = nullptr;
  OutArray grad_value = new_array(dt, value.shape, &gv);
  OutArray grad_loc = new_array(dt, loc.shape, &gl);
  OutArray grad_weights = new_array(dt, weights.shape, &ga);
  Status st;
  {
    nb::gil_scoped_release release;
    dispatch(dt, [&](auto tag) {
      using T = decltype(tag);
      st = ms_deform_attn_backward_cpu<T>(data<T>(grad), data<T>(value), data<int64_t>(shapes), data<int64_t>(starts),
                                          data<T>(loc), data<T>(weights), static_cast<T*>(gv), static_cast<T*>(gl),
                                          static_cast<T*>(ga), d, ParallelFor(), variant);
    });
  }
  check(st, "ms_deform_attn_backward");
  return {to_python(grad_value, dt), to_python(grad_loc, dt), to_python(grad_weights, dt)};
}

void bind(nb::module_& m) {
  m.def("ms_deform_attn", &forward_py, nb::arg("value"), nb::arg("spatial_shapes"), nb::arg("level_start_index"),
        nb::arg("sampling_locations"), nb::arg("attention_weights"), nb::arg("isa") = "auto",
        "Multi-scale deformable attention (value (N, S, M, D), spatial_shapes (L, 2) int64, level_start_index (L,) "
        "int64, sampling_locations (N, Lq, M, L, P, 2), attention_weights (N, Lq, M, L, P)) -> (N, Lq, M * D), "
        "computed by opbridge's CPU kernel (isa: 'auto', 'baseline', 'avx2' or 'avx512').");
  m.def("ms_deform_attn_backward", &backward_py, nb::arg("grad_output"), nb::arg("value"), nb::arg("spatial_shapes"),
        nb::arg("level_start_index"), nb::arg("sampling_locations"), nb::arg("attention_weights"),
        nb::arg("isa") = "auto",
        "Gradients (grad_value, grad_sampling_locations, grad_attention_weights) of sum(ms_deform_attn(...) * "
        "grad_output), computed by opbridge's CPU kernel.");
}

}  // namespace
}  // namespace opbridge::py

OPBRIDGE_REGISTER_PY(opbridge::py::bind);
