// opbridge's C ABI: what every library built on opbridge exports beside its framework's entry
// points (the ORT library: RegisterCustomOps; the torch library: its ops; opbridge._core), so that
// a program without torch or ONNX Runtime reads the library's declarations
// (OpbridgeDescribeOps), runs their checks (OpbridgeCheckCall, what torch's fake kernels do) and
// runs its ops' CPU compute functions on host memory (OpbridgeRunHost, what opbridge._core does);
// the build reads OpbridgeDeclarationErrors (opbridge_add_op's check of the declarations).
//
// Written once, here: the core library implements it (opbridge_core, cpp/core/bridge.cpp), every
// library's entry file defines the exported functions with OPBRIDGE_C_ENTRY_POINTS, opbridge._core
// calls OpbridgeRunHost through these types, and Python's ctypes side (opbridge/_c_abi.py), which
// cannot include a header, compares its structures with OpbridgeAbiLayout() whenever it loads a
// library.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Bumped whenever a structure or a signature below changes.
#define OPBRIDGE_C_ABI_VERSION 1

// One input of a call, in declaration order.
typedef struct OpbridgeTensor {
  int32_t present;      // 0: an absent optional input (the other fields are ignored)
  int32_t type;         // ONNX element type (TensorProto.DataType)
  int64_t rank;         // -1: unknown
  const int64_t* dims;  // rank entries, -1 where unknown
  const void* data;     // host data: of a host_memory input (checks), of every input (runs); or NULL
} OpbridgeTensor;

// One attribute, in declaration order.
typedef struct OpbridgeAttr {
  int32_t present;       // 0: the declared default (the other fields are ignored)
  int64_t i;             // int and bool attributes
  double f;              // float attributes
  const char* s;         // string attributes (NUL-terminated)
  int64_t n;             // the number of ints or floats
  const int64_t* ints;   // int-list attributes
  const double* floats;  // float-list attributes
} OpbridgeAttr;

// Allocates output `output` of ONNX element type `type` and shape dims[0..rank) for
// OpbridgeRunHost; returns its memory (valid until OpbridgeRunHost returns), or NULL on failure.
typedef void* (*OpbridgeAlloc)(void* ctx, int64_t output, int32_t type, int64_t rank, const int64_t* dims);

// The exported functions. Each returns or writes a status: the opbridge::StatusCode (0: ok) and,
// for an error, its message (NUL-terminated, truncated to `size` bytes) in `message`. None throws.
//
// The JSON description of the library's declared ops (static storage, never freed).
typedef const char* (*OpbridgeDescribeOpsFn)(void);
// What is wrong with the library's misdeclared ops, one op a line; "" when nothing is.
typedef const char* (*OpbridgeDeclarationErrorsFn)(void);
// Runs the declaration's checks of op `op` (its torch name) on a call, as the kernels do.
typedef int32_t (*OpbridgeCheckCallFn)(const char* op, const OpbridgeTensor* inputs, int64_t n_inputs,
                                       const OpbridgeAttr* attrs, int64_t n_attrs, char* message, int64_t size);
// Checks a call of op `op` and runs its CPU compute function serially on host memory, asking
// `alloc` for each output. isa: an opbridge::CpuIsa; channels_last: see KernelCall::channels_last
// (the shapes are the logical ones).
typedef int32_t (*OpbridgeRunHostFn)(const char* op, const OpbridgeTensor* inputs, int64_t n_inputs,
                                     const OpbridgeAttr* attrs, int64_t n_attrs, int32_t isa, int32_t channels_last,
                                     OpbridgeAlloc alloc, void* alloc_ctx, char* message, int64_t size);
// This library's view of the structures above, as JSON: {"version": OPBRIDGE_C_ABI_VERSION,
// "OpbridgeTensor": {"size": bytes, "fields": [[name, offset, bytes], ...]}, "OpbridgeAttr": ...}.
typedef const char* (*OpbridgeAbiLayoutFn)(void);

#ifdef __cplusplus
}  // extern "C"

namespace opbridge::c_abi {

// The implementations (the core library), for the ops of `library` (opbridge_add_op's LIBRARY;
// nullptr: every op of this binary) in ONNX domain `domain`.
const char* describe_ops(const char* domain, const char* library) noexcept;
const char* declaration_errors(const char* library) noexcept;
int32_t check_call(const char* op, const OpbridgeTensor* inputs, int64_t n_inputs, const OpbridgeAttr* attrs,
                   int64_t n_attrs, char* message, int64_t size, const char* library) noexcept;
int32_t run_host(const char* op, const OpbridgeTensor* inputs, int64_t n_inputs, const OpbridgeAttr* attrs,
                 int64_t n_attrs, int32_t isa, int32_t channels_last, OpbridgeAlloc alloc, void* alloc_ctx,
                 char* message, int64_t size, const char* library) noexcept;
const char* abi_layout() noexcept;
// The highest version among the library's declared ops (1 when it has none): the newest version
// of its domain it serves.
int domain_version(const char* library);

}  // namespace opbridge::c_abi

// OPBRIDGE_C_ENTRY_POINTS(domain, library): defines the exported functions above, serving the
// ops of `library` (a const char*; nullptr: all of this binary's) in ONNX domain `domain`. Exactly
// one per binary, at namespace scope: the entry files of the ORT library (OPBRIDGE_ORT_LIBRARY) and
// the torch library (OPBRIDGE_TORCH_LIBRARY), and opbridge._core, use it.
#define OPBRIDGE_C_ENTRY_POINTS(domain, library)                                                                  \
  extern "C" __attribute__((visibility("default"))) const char* OpbridgeDescribeOps() {                           \
    return ::opbridge::c_abi::describe_ops((domain), (library));                                                  \
  }                                                                                                               \
  extern "C" __attribute__((visibility("default"))) const char* OpbridgeDeclarationErrors() {                     \
    return ::opbridge::c_abi::declaration_errors((library));                                                      \
  }                                                                                                               \
  extern "C" __attribute__((visibility("default"))) int32_t OpbridgeCheckCall(                                    \
      const char* op, const OpbridgeTensor* inputs, int64_t n_inputs, const OpbridgeAttr* attrs, int64_t n_attrs, \
      char* message, int64_t size) {                                                                              \
    return ::opbridge::c_abi::check_call(op, inputs, n_inputs, attrs, n_attrs, message, size, (library));         \
  }                                                                                                               \
  extern "C" __attribute__((visibility("default"))) int32_t OpbridgeRunHost(                                      \
      const char* op, const OpbridgeTensor* inputs, int64_t n_inputs, const OpbridgeAttr* attrs, int64_t n_attrs, \
      int32_t isa, int32_t channels_last, OpbridgeAlloc alloc, void* alloc_ctx, char* message, int64_t size) {    \
    return ::opbridge::c_abi::run_host(op, inputs, n_inputs, attrs, n_attrs, isa, channels_last, alloc,           \
                                       alloc_ctx, message, size, (library));                                      \
  }                                                                                                               \
  extern "C" __attribute__((visibility("default"))) const char* OpbridgeAbiLayout() {                             \
    return ::opbridge::c_abi::abi_layout();                                                                       \
  }
#endif  // __cplusplus
