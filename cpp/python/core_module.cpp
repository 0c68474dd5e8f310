// opbridge._core: build information, and the one generic binding that runs any declared op's CPU
// kernel on arrays (numpy, or anything speaking DLPack), so the kernels can be tested and used
// without torch or ONNX Runtime.
//
// Every library built on opbridge exports opbridge's C ABI (opbridge/c_abi.h), whose
// OpbridgeRunHost checks a call with the op's declaration, asks for its outputs and runs the op's
// registered CPU compute function (opbridge/kernel.h). _core.run calls it at the address it is
// given; opbridge/_declarations.py binds an op's arguments by its declaration (OpDecl.run) and makes
// _core.<op> of every op of opbridge's library. This module links opbridge's own ops and the core
// library and exports the C ABI itself, so opbridge's declarations, checks and CPU kernels need
// neither the ORT library nor torch's (opbridge/_op_library.py reads them from here).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <Eigen/Core>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "opbridge/c_abi.h"
#include "opbridge/cpu_isa.h"
#include "opbridge/op_decl.h"

#ifndef OPBRIDGE_VERSION
#error "OPBRIDGE_VERSION must be defined by the build"
#endif

namespace opbridge::py {
namespace {

namespace nb = nanobind;

// A read-only, C-contiguous CPU array of any dtype (numpy, or anything with __dlpack__).
using InArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<nb::numpy>;

// The ONNX element type of an array's dtype (kUndefined for one no op takes: the declaration's
// checks then name it).
ElemType elem_type(const nb::dlpack::dtype& d) {
  if (d.lanes != 1) return ElemType::kUndefined;
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Float:
      return d.bits == 32 ? ElemType::kFloat32 : d.bits == 64 ? ElemType::kFloat64
                                             : d.bits == 16 ? ElemType::kFloat16 : ElemType::kUndefined;
    case nb::dlpack::dtype_code::Bfloat: return d.bits == 16 ? ElemType::kBFloat16 : ElemType::kUndefined;
    case nb::dlpack::dtype_code::Int:
      return d.bits == 8 ? ElemType::kInt8 : d.bits == 16 ? ElemType::kInt16 : d.bits == 32 ? ElemType::kInt32
                                                                            : d.bits == 64 ? ElemType::kInt64
                                                                                           : ElemType::kUndefined;
    case nb::dlpack::dtype_code::UInt:
      return d.bits == 8 ? ElemType::kUint8 : d.bits == 16 ? ElemType::kUint16 : d.bits == 32 ? ElemType::kUint32
                                                                              : d.bits == 64 ? ElemType::kUint64
                                                                                             : ElemType::kUndefined;
    case nb::dlpack::dtype_code::Bool: return ElemType::kBool;
    case nb::dlpack::dtype_code::Complex:
      return d.bits == 64 ? ElemType::kComplex64 : d.bits == 128 ? ElemType::kComplex128 : ElemType::kUndefined;
    default: return ElemType::kUndefined;
  }
}

// One array argument: the array (kept alive for the call) and its element type. Numpy arrays of
// ml_dtypes.bfloat16, which numpy exports neither through the buffer protocol nor through
// DLPack, are read through a uint16 view of the same memory (made C-contiguous first).
struct Array {
  InArray array;
  ElemType type = ElemType::kUndefined;
  std::vector<int64_t> shape;  // logical
};

Array array_arg(nb::handle obj, const std::string& op, const std::string& name) {
  Array a;
  const nb::module_ np = nb::module_::import_("numpy");
  if (nb::isinstance(obj, np.attr("ndarray")) && nb::str(obj.attr("dtype").attr("name")).equal(nb::str("bfloat16"))) {
    nb::object bits = np.attr("ascontiguousarray")(obj).attr("view")(np.attr("uint16"));
    a.array = nb::cast<InArray>(bits);
    a.type = ElemType::kBFloat16;
  } else {
    if (!nb::try_cast(obj, a.array)) {
      throw nb::type_error((op + ": " + name + " must be an array (numpy, or anything with __dlpack__), got " +
                            nb::type_name(obj.type()).c_str())
                               .c_str());
    }
    a.type = elem_type(a.array.dtype());
  }
  a.shape.resize(a.array.ndim());
  for (size_t i = 0; i < a.array.ndim(); ++i) a.shape[i] = static_cast<int64_t>(a.array.shape(i));
  return a;
}

// (N, *spatial, C) memory seen as the logical (N, C, *spatial), and back.
std::vector<int64_t> to_logical(const std::vector<int64_t>& s) {
  if (s.size() < 2) return s;
  std::vector<int64_t> out{s.front(), s.back()};
  out.insert(out.end(), s.begin() + 1, s.end() - 1);
  return out;
}
std::vector<int64_t> to_physical(const std::vector<int64_t>& s) {
  if (s.size() < 2) return s;
  std::vector<int64_t> out{s.front()};
  out.insert(out.end(), s.begin() + 2, s.end());
  out.push_back(s[1]);
  return out;
}

// A new numpy array of `type` and `shape`, owning its memory; bfloat16 as uint16 bits.
OutArray new_array(ElemType type, const std::vector<int64_t>& shape, void** data) {
  nb::dlpack::dtype dt{};
  size_t itemsize = 0;
  switch (type) {
    case ElemType::kFloat32: dt = nb::dtype<float>(); itemsize = 4; break;
    case ElemType::kFloat64: dt = nb::dtype<double>(); itemsize = 8; break;
    case ElemType::kFloat16:
      dt = {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
      itemsize = 2;
      break;
    case ElemType::kBFloat16: dt = nb::dtype<uint16_t>(); itemsize = 2; break;
    case ElemType::kInt64: dt = nb::dtype<int64_t>(); itemsize = 8; break;
    case ElemType::kInt32: dt = nb::dtype<int32_t>(); itemsize = 4; break;
    default: throw std::runtime_error(std::string("_core: no array type for element type ") + elem_type_name(type));
  }
  size_t n = 1;
  bool overflow = false;
  for (int64_t d : shape) overflow |= d < 0 || __builtin_mul_overflow(n, static_cast<size_t>(d), &n);
  if (overflow || __builtin_mul_overflow(n, itemsize, &n)) throw std::length_error("array too large");
  auto* buf = new unsigned char[n > 0 ? n : 1];
  nb::capsule owner(buf, [](void* p) noexcept { delete[] static_cast<unsigned char*>(p); });
  std::vector<size_t> ushape(shape.begin(), shape.end());
  *data = buf;
  return OutArray(buf, ushape.size(), ushape.data(), owner, nullptr, dt);
}

// The Python object for a result: a numpy array; bfloat16 (stored as uint16 bits) as an
// ml_dtypes.bfloat16 array, which needs ml_dtypes installed.
nb::object to_python(const OutArray& out, ElemType type) {
  nb::object result = nb::cast(out);
  if (type != ElemType::kBFloat16) return result;
  nb::object ml_dtypes;
  try {
    ml_dtypes = nb::module_::import_("ml_dtypes");
  } catch (nb::python_error&) {
    throw nb::type_error("bfloat16 results are returned as ml_dtypes.bfloat16 numpy arrays: install ml_dtypes");
  }
  return result.attr("view")(ml_dtypes.attr("bfloat16"));
}

// What the allocation callback fills, one entry per output.
struct Outputs {
  std::vector<bool> channels_last;  // per output: allocate (N, *spatial, C)
  bool layout = false;
  std::vector<OutArray> arrays;
  std::vector<ElemType> types;
  std::string error;
};

void* allocate(void* ctx, int64_t output, int32_t type, int64_t rank, const int64_t* dims) {
  auto* outs = static_cast<Outputs*>(ctx);
  // Called from the kernel's thread while the GIL is released.
  nb::gil_scoped_acquire gil;
  try {
    std::vector<int64_t> shape(dims, dims + rank);
    const size_t o = static_cast<size_t>(output);
    if (outs->layout && o < outs->channels_last.size() && outs->channels_last[o]) shape = to_physical(shape);
    void* data = nullptr;
    OutArray a = new_array(static_cast<ElemType>(type), shape, &data);
    if (outs->arrays.size() <= o) {
      outs->arrays.resize(o + 1);
      outs->types.resize(o + 1);
    }
    outs->arrays[o] = a;
    outs->types[o] = static_cast<ElemType>(type);
    return data;
  } catch (const std::exception& e) {
    outs->error = e.what();
    return nullptr;
  }
}

// Runs op `op` of the library whose OpbridgeRunHost is at `entry` (its address).
//   inputs: per declared input, (name, array or None, channels_last: whether that array is
//           (N, *spatial, C) memory of the logical (N, C, *spatial))
//   attrs:  per declared attribute, (type key: "int", "float", "str", "bool", "int[]", "float[]",
//           value or None for the default)
//   out_channels_last: per output, whether it is allocated (N, *spatial, C) when channels_last
nb::list run(uintptr_t entry, const std::string& op, nb::list inputs, nb::list attrs,
             const std::vector<bool>& out_channels_last, const std::string& isa_name, bool channels_last) {
  CpuIsa isa = CpuIsa::kAuto;
  if (!parse_cpu_isa(isa_name.c_str(), &isa)) {
    throw nb::value_error((op + ": isa must be 'auto', 'baseline', 'avx2' or 'avx512', got '" + isa_name + "'").c_str());
  }
  // _core's instruction-set level (set_cpu_isa) for calls that leave the choice to it.
  if (isa == CpuIsa::kAuto) isa = cpu_isa_resolve(CpuIsa::kAuto);
  std::vector<Array> arrays(inputs.size());
  std::vector<OpbridgeTensor> tensors(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    nb::tuple item = nb::cast<nb::tuple>(inputs[i]);
    const std::string name = nb::cast<std::string>(item[0]);
    OpbridgeTensor& t = tensors[i];
    t = OpbridgeTensor{0, 0, 0, nullptr, nullptr};
    if (item[1].is_none()) continue;
    Array& a = arrays[i];
    a = array_arg(item[1], op, name);
    if (channels_last && nb::cast<bool>(item[2])) a.shape = to_logical(a.shape);
    t.present = 1;
    t.type = static_cast<int32_t>(a.type);
    t.rank = static_cast<int64_t>(a.shape.size());
    t.dims = a.shape.data();
    t.data = a.array.data();
  }
  std::vector<std::string> strings(attrs.size());
  std::vector<std::vector<int64_t>> ints(attrs.size());
  std::vector<std::vector<double>> floats(attrs.size());
  std::vector<OpbridgeAttr> values(attrs.size());
  for (size_t i = 0; i < attrs.size(); ++i) {
    nb::tuple item = nb::cast<nb::tuple>(attrs[i]);
    const std::string kind = nb::cast<std::string>(item[0]);
    OpbridgeAttr& v = values[i];
    v = OpbridgeAttr{0, 0, 0.0, nullptr, 0, nullptr, nullptr};
    if (item[1].is_none()) continue;
    v.present = 1;
    if (kind == "int" || kind == "bool") {
      v.i = nb::cast<int64_t>(item[1]);
    } else if (kind == "float") {
      v.f = nb::cast<double>(item[1]);
    } else if (kind == "str") {
      strings[i] = nb::cast<std::string>(item[1]);
      v.s = strings[i].c_str();
    } else if (kind == "int[]") {
      ints[i] = nb::cast<std::vector<int64_t>>(item[1]);
      v.n = static_cast<int64_t>(ints[i].size());
      v.ints = ints[i].data();
    } else if (kind == "float[]") {
      floats[i] = nb::cast<std::vector<double>>(item[1]);
      v.n = static_cast<int64_t>(floats[i].size());
      v.floats = floats[i].data();
    } else {
      throw nb::value_error(("_core.run: unknown attribute type " + kind).c_str());
    }
  }
  Outputs outs;
  outs.channels_last = out_channels_last;
  outs.layout = channels_last;
  char message[2048] = {0};
  int32_t code = 0;
  {
    // The kernel touches no Python objects (the allocation callback takes the GIL back): let
    // other Python threads run meanwhile.
    nb::gil_scoped_release release;
    code = reinterpret_cast<OpbridgeRunHostFn>(entry)(op.c_str(), tensors.data(), static_cast<int64_t>(tensors.size()),
                                            values.data(), static_cast<int64_t>(values.size()),
                                            static_cast<int32_t>(isa), channels_last ? 1 : 0, &allocate, &outs,
                                            message, sizeof message);
  }
  if (code != 0) {
    const std::string msg = op + ": " + (outs.error.empty() ? std::string(message) : outs.error);
    switch (static_cast<StatusCode>(code)) {
      case StatusCode::kInvalidArgument: throw nb::value_error(msg.c_str());
      case StatusCode::kTypeError: throw nb::type_error(msg.c_str());
      default: throw std::runtime_error(msg);
    }
  }
  nb::list result;
  for (size_t o = 0; o < outs.arrays.size(); ++o) result.append(to_python(outs.arrays[o], outs.types[o]));
  return result;
}

}  // namespace
}  // namespace opbridge::py

// opbridge's own ops, served from this module (the ORT and torch libraries serve the same).
OPBRIDGE_C_ENTRY_POINTS("ai.opbridge", "opbridge")

NB_MODULE(_core, m) {
  namespace nb = nanobind;
  m.doc() = "opbridge build information and its ops' CPU kernels on numpy arrays";
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

  // Instruction-set level of the kernels _core runs (opbridge/cpu_isa.h): handed to every call
  // that leaves the choice to _core. The torch and ORT libraries keep their own (environment
  // variable OPBRIDGE_CPU_ISA).
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
  m.def("run", &opbridge::py::run, nb::arg("entry"), nb::arg("op"), nb::arg("inputs"), nb::arg("attrs"),
        nb::arg("out_channels_last"), nb::arg("isa") = "auto", nb::arg("channels_last") = false,
        "Runs op `op`'s CPU kernel through the library entry point at address `entry` (OpbridgeRunHost); "
        "returns its outputs. opbridge's ops are _core.<op>(...) (opbridge/_declarations.py: OpDecl.run binds the "
        "arguments by the declaration).");
  // _core.group_norm, _core.inverse, ...: every op of opbridge's library, from its declaration.
  m.def("__getattr__", [](nb::str name) -> nb::object {
    return nb::module_::import_("opbridge._op_library").attr("_core_function")(name);
  });
}
