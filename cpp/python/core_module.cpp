// opbridge._core: build information and the framework-free CPU kernels on numpy arrays, so the
// kernels can be tested and used without torch or ONNX Runtime.
#include "core_module.h"

#include <nanobind/stl/string.h>

#include <Eigen/Core>

#include "opbridge/cpu_isa.h"

#ifndef OPBRIDGE_VERSION
#error "OPBRIDGE_VERSION must be defined by the build"
#endif

namespace opbridge::py {

std::vector<Binder>& binders() {
  static std::vector<Binder> b;
  return b;
}

DType dtype_of_array(const InArray& a, const char* op, const char* arg) {
  const auto d = a.dtype();
  if (d == nb::dtype<float>()) return DType::kFloat32;
  if (d == nb::dtype<double>()) return DType::kFloat64;
  if (d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && d.bits == 16 && d.lanes == 1)
    return DType::kFloat16;
  if (d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && d.bits == 16 && d.lanes == 1)
    return DType::kBFloat16;
  throw nb::type_error((std::string(op) + ": " + arg +
                        " must be a float32, float64, float16 or bfloat16 array").c_str());
}

void check(const Status& st, const char* op) {
  if (st.ok()) return;
  const std::string msg = std::string(op) + ": " + st.message();
  switch (st.code()) {
    case StatusCode::kInvalidArgument: throw nb::value_error(msg.c_str());
    case StatusCode::kTypeError: throw nb::type_error(msg.c_str());
    case StatusCode::kNotImplemented: throw nb::builtin_exception(nb::exception_type::runtime_error, msg.c_str());
    default: throw std::runtime_error(msg);
  }
}

TensorArg tensor_arg(const ArrayArg* a) {
  TensorArg t;
  if (a == nullptr) return t;
  t.present = true;
  switch (a->dtype) {
    case DType::kFloat32: t.type = ElemType::kFloat32; break;
    case DType::kFloat64: t.type = ElemType::kFloat64; break;
    case DType::kFloat16: t.type = ElemType::kFloat16; break;
    case DType::kBFloat16: t.type = ElemType::kBFloat16; break;
  }
  t.shape = shape_of(a->array);
  return t;
}

ArrayArg array_arg(nb::handle obj, const char* op, const char* arg) {
  const nb::module_ np = nb::module_::import_("numpy");
  if (nb::isinstance(obj, np.attr("ndarray")) && nb::str(obj.attr("dtype").attr("name")).equal(nb::str("bfloat16"))) {
    nb::object bits = np.attr("ascontiguousarray")(obj).attr("view")(np.attr("uint16"));
    return {nb::cast<InArray>(bits), DType::kBFloat16};
  }
  InArray a;
  if (!nb::try_cast(obj, a)) {
    throw nb::type_error((std::string(op) + ": " + arg + " must be an array (numpy, or anything with __dlpack__), got " +
                          nb::type_name(obj.type()).c_str()).c_str());
  }
  return {a, dtype_of_array(a, op, arg)};
}

nb::object to_python(OutArray out, DType dtype) {
  nb::object result = nb::cast(out);
  if (dtype != DType::kBFloat16) return result;
  nb::object ml_dtypes;
  try {
    ml_dtypes = nb::module_::import_("ml_dtypes");
  } catch (nb::python_error&) {
    throw nb::type_error("bfloat16 results are returned as ml_dtypes.bfloat16 numpy arrays: install ml_dtypes");
  }
  return result.attr("view")(ml_dtypes.attr("bfloat16"));
}

std::vector<int64_t> shape_of(const InArray& a) {
  std::vector<int64_t> s(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) s[i] = static_cast<int64_t>(a.shape(i));
  return s;
}

OutArray new_array(DType dtype, const std::vector<int64_t>& shape, void** data) {
  size_t n = 1;
  bool overflow = false;
  for (int64_t d : shape) overflow |= __builtin_mul_overflow(n, static_cast<size_t>(d), &n);
  nb::dlpack::dtype dt{};
  size_t itemsize = 0;
  switch (dtype) {
    case DType::kFloat32: dt = nb::dtype<float>(); itemsize = 4; break;
    case DType::kFloat64: dt = nb::dtype<double>(); itemsize = 8; break;
    case DType::kFloat16:
      dt = {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
      itemsize = 2;
      break;
    case DType::kBFloat16:
      // numpy has no bfloat16: the bits go out as uint16 (to_python views them as ml_dtypes').
      dt = nb::dtype<uint16_t>();
      itemsize = 2;
      break;
  }
  if (overflow || __builtin_mul_overflow(n, itemsize, &n)) throw std::length_error("array too large");
  auto* buf = new unsigned char[n > 0 ? n : 1];
  nb::capsule owner(buf, [](void* p) noexcept { delete[] static_cast<unsigned char*>(p); });
  std::vector<size_t> ushape(shape.begin(), shape.end());
  *data = buf;
  return OutArray(buf, ushape.size(), ushape.data(), owner, nullptr, dt);
}

}  // namespace opbridge::py

NB_MODULE(_core, m) {
  namespace nb = nanobind;
  m.doc() = "opbridge build information and framework-free CPU kernels on numpy arrays";
  nb::dict info;
  info["version"] = OPBRIDGE_VERSION;
  // The torch the extension was built against ("" when built without it); it loads into every
  // torch from torch_target on (stable ABI), its optional fast-path library into this one only.
  info["torch_version"] = OPBRIDGE_TORCH_VERSION;
  info["torch_target"] = OPBRIDGE_TORCH_TARGET;
  info["ort_api_version"] = OPBRIDGE_ORT_API_VERSION;
  info["eigen_version"] = std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
                          std::to_string(EIGEN_MINOR_VERSION);
  // CUDA kernels compiled into the ORT library and the torch one.
  info["cuda"] = static_cast<bool>(OPBRIDGE_WITH_CUDA);
  info["cuda_version"] = OPBRIDGE_CUDA_VERSION;  // nvcc's version, "" without CUDA
  info["cuda_option"] = OPBRIDGE_CUDA_OPTION;    // the OPBRIDGE_WITH_CUDA setting: AUTO, ON or OFF
  // torch.ops.opbridge.* run on CUDA tensors (of a CUDA torch)
  info["torch_cuda"] = static_cast<bool>(OPBRIDGE_TORCH_CUDA);
  info["compiler"] = OPBRIDGE_COMPILER;
  m.attr("build_info") = info;

  // Instruction-set level of this module's CPU kernels (opbridge/cpu_isa.h). The torch and ORT
  // libraries keep their own (environment variable OPBRIDGE_CPU_ISA).
  const auto parse = [](const std::string& name, const char* fn) {
    opbridge::CpuIsa isa;
    if (!opbridge::parse_cpu_isa(name.c_str(), &isa)) {
      throw nb::value_error((std::string(fn) + ": name must be 'auto', 'baseline', 'avx2' or 'avx512', got '" +
                             name + "'").c_str());
    }
    return isa;
  };
  m.def("cpu_isa", [] { return std::string(opbridge::cpu_isa_name(opbridge::cpu_isa_resolve(opbridge::CpuIsa::kAuto))); },
        "The instruction-set level _core's kernels use now: 'baseline', 'avx2' or 'avx512'.");
  m.def(
      "cpu_isa_supported", [parse](const std::string& name) { return opbridge::cpu_isa_supported(parse(name, "cpu_isa_supported")); },
      nb::arg("name"), "Whether this build and CPU can run the kernels' variant `name`.");
  m.def(
      "set_cpu_isa",
      [parse](const std::string& name) {
        return std::string(opbridge::cpu_isa_name(opbridge::set_cpu_isa(parse(name, "set_cpu_isa"))));
      },
      nb::arg("name"),
      "Sets _core's instruction-set level ('auto': the best); returns the level now in effect, which is "
      "lower than asked where the CPU lacks it. For tests and benchmarks.");
  for (auto bind : opbridge::py::binders()) bind(m);
}
