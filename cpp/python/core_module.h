// opbridge._core helpers shared by the per-op binding files (cpp/ops/<op>/<op>_py.cpp).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "opbridge/dtype.h"
#include "opbridge/op_decl.h"
#include "opbridge/status.h"

namespace opbridge::py {

namespace nb = nanobind;

// A read-only, C-contiguous CPU array of any dtype (numpy, or anything speaking DLPack).
using InArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<nb::numpy>;

// The opbridge element type of `a`; raises TypeError naming `arg` otherwise.
DType dtype_of_array(const InArray& a, const char* op, const char* arg);

// An array argument and its element type. Accepts what InArray accepts (numpy arrays, DLPack
// producers such as torch tensors) and also numpy arrays of ml_dtypes.bfloat16, which numpy can
// export neither through the buffer protocol nor through DLPack: those are read through a
// uint16 view of the same memory (made C-contiguous first).
struct ArrayArg {
  InArray array;
  DType dtype;
};
ArrayArg array_arg(nb::handle obj, const char* op, const char* arg);

// The Python object for a result made by new_array: a numpy array; bfloat16 results (stored as
// uint16 bits) become ml_dtypes.bfloat16 arrays, and need ml_dtypes installed.
nb::object to_python(OutArray out, DType dtype);

// Raises the Python exception matching a non-ok Status (ValueError / NotImplementedError / RuntimeError).
void check(const Status& st, const char* op);
std::vector<int64_t> shape_of(const InArray& a);
// A new numpy array of `dtype` and `shape`, owning its memory.
OutArray new_array(DType dtype, const std::vector<int64_t>& shape, void** data);

// What a declared op's checks see of an array argument (nullptr: an omitted optional input).
TensorArg tensor_arg(const ArrayArg* a);

// Calls f(T{}) with T matching dtype (float32/float64/float16/bfloat16).
template <class F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: f(float{}); break;
    case DType::kFloat64: f(double{}); break;
    case DType::kFloat16: f(Half{}); break;
    case DType::kBFloat16: f(BFloat16{}); break;
  }
}

// Each op's binding file registers a function that adds its functions to the module.
using Binder = void (*)(nb::module_&);
std::vector<Binder>& binders();
struct BinderRegistrar {
  explicit BinderRegistrar(Binder b) { binders().push_back(b); }
};

}  // namespace opbridge::py

#define OPBRIDGE_PY_CONCAT_(a, b) a##b
#define OPBRIDGE_PY_CONCAT(a, b) OPBRIDGE_PY_CONCAT_(a, b)
#define OPBRIDGE_REGISTER_PY(fn) \
  static const ::opbridge::py::BinderRegistrar OPBRIDGE_PY_CONCAT(opbridge_py_binder_, __LINE__)(fn)
