// opbridge ORT adapter layer: every registered compute function (opbridge/kernel.h) of a library
// as an OrtCustomOp, its types, attributes and shape inference from its declaration.
//
// Only the ORT C API is used, through the table negotiated in RegisterCustomOps
// (min(runtime, compiled) version), so one build loads into every ORT >= kMinOrtApiVersion.
// No C++ exception crosses the C ABI: every callback ORT makes into us is wrapped by guard().
#pragma once

#include <onnxruntime_c_api.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "opbridge/c_abi.h"
#include "opbridge/kernel.h"
#include "opbridge/op_decl.h"
#include "opbridge/parallel.h"
#include "opbridge/status.h"

namespace opbridge::ort {

// Oldest ORT C API we support: 1.17 added InferOutputShapeFn, opset ranges,
// KernelContext_ParallelFor and the ShapeInferContext_* / ReadOpAttr functions, all of which the
// ops rely on. Every OrtApi function this library calls must exist in API 17: with an older
// table negotiated, a newer entry would read past the end of the runtime's OrtApi struct.
inline constexpr uint32_t kMinOrtApiVersion = 17;

// The custom-op domain of every opbridge op: a contract with the exporter. Libraries of
// users' own ops, built on this adapter layer, register theirs in a domain of their own.
inline constexpr const char* kDomain = "ai.opbridge";

// The API table negotiated at registration (never null once RegisterCustomOps succeeded).
const OrtApi& api();
uint32_t api_version();
void set_api(const OrtApi* api, uint32_t version);
// The domain this library registered its ops in (kDomain until register_custom_ops ran).
const char* domain();

// The body of a library's RegisterCustomOps: negotiates the C API version (min of the
// runtime's and these headers', at least kMinOrtApiVersion) and adds every op of the library
// (library_specs) to `options` in the custom-op domain `domain`. Returns nullptr on success,
// else an error status (ORT releases it); never throws. A library uses one domain for all its
// calls.
//   options:  the session options to register with (nullptr: nothing is done)
//   api_base: what ORT passed to RegisterCustomOps (nullptr: nothing is done)
//   domain:   the ONNX domain of the library's nodes, e.g. kDomain; non-empty
//   library:  the library whose compute functions (opbridge/kernel.h) it serves (nullptr: all
//             of this binary's)
OrtStatus* register_custom_ops(OrtSessionOptions* options, const OrtApiBase* api_base, const char* domain,
                               const char* library = nullptr) noexcept;

// An error on its way to ORT. Thrown inside adapters, turned into an OrtStatus by guard().
class Error : public std::exception {
 public:
  Error(OrtErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  OrtErrorCode code() const { return code_; }

 private:
  OrtErrorCode code_;
  std::string message_;
};

[[noreturn]] void fail(OrtErrorCode code, const std::string& message);
// Throws Error when `status` is an error (and releases it).
void check(OrtStatus* status);
// Throws Error for a non-ok opbridge::Status, prefixed with `where`.
void check(const Status& status, const std::string& where);

// Runs f() and converts any exception into an OrtStatus*; nullptr means success.
template <class F>
OrtStatus* guard(F&& f) noexcept {
  try {
    f();
    return nullptr;
  } catch (const Error& e) {
    return api().CreateStatus(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return api().CreateStatus(ORT_FAIL, "opbridge: out of memory");
  } catch (const std::exception& e) {
    return api().CreateStatus(ORT_FAIL, e.what());
  } catch (...) {
    return api().CreateStatus(ORT_FAIL, "opbridge: unknown error");
  }
}

// Read-only view of one kernel input.
struct Input {
  bool present = false;  // false for an omitted optional input
  const void* data = nullptr;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> shape;
};

// Scratch memory from an execution provider's allocator (device memory for the CUDA EP),
// released when the object dies. For GPU kernels that is right after the work was queued: the
// provider's allocator hands the block out again only to later work, which its single compute
// stream orders after ours (ORT's own CUDA kernels rely on the same for their scratch buffers).
class Scratch {
 public:
  Scratch() = default;
  Scratch(OrtAllocator* allocator, void* data) : allocator_(allocator), data_(data) {}
  Scratch(Scratch&& o) noexcept : allocator_(o.allocator_), data_(o.data_) {
    o.allocator_ = nullptr;
    o.data_ = nullptr;
  }
  Scratch& operator=(Scratch&& o) noexcept;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { reset(); }
  void* get() const { return data_; }

 private:
  void reset() noexcept;
  OrtAllocator* allocator_ = nullptr;
  void* data_ = nullptr;
};

// Inputs, outputs, thread pool and stream of one Compute call.
class KernelIO {
 public:
  explicit KernelIO(OrtKernelContext* ctx) : ctx_(ctx) {}
  size_t input_count() const;
  Input input(size_t index) const;
  // Allocates output `index` with `shape`; returns its data.
  void* output(size_t index, const std::vector<int64_t>& shape) const;
  template <class T> T* output_as(size_t index, const std::vector<int64_t>& shape) const {
    return static_cast<T*>(output(index, shape));
  }
  // ORT's intra-op thread pool (serial when the session has one thread).
  ParallelFor parallel() const;
  // The execution provider's compute stream (a cudaStream_t for CUDA).
  void* gpu_stream() const;
  // `bytes` of scratch in the memory input `like_input` lives in (the provider's allocator);
  // empty (get() == nullptr) when bytes == 0.
  Scratch scratch(size_t bytes, size_t like_input) const;

 private:
  OrtKernelContext* ctx_;
};

// "Op 'name'" prefix for messages, with the node name where ORT provides it.
std::string node_label(const OrtKernelInfo* info, const char* op_type);

// Type and shape of one input during ORT's shape inference (model load).
struct InferInput {
  bool present = false;  // false for an omitted optional input
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  // Dimensions, -1 where symbolic or unknown. ORT reports an input of unknown rank as rank 0,
  // so an empty `shape` means "rank unknown" for inputs that cannot be scalars.
  std::vector<int64_t> shape;
  // The symbolic name of each dimension ("" where it has none), same length as shape.
  std::vector<std::string> symbols;
};

// What an op's shape-inference function sees: its inputs, attributes and outputs.
class InferIO {
 public:
  explicit InferIO(OrtShapeInferContext* ctx) : ctx_(ctx) {}
  size_t input_count() const;
  InferInput input(size_t index) const;
  // Output `out` gets input `in`'s element type and shape, symbolic dimensions included.
  // Does nothing when input `in` has rank 0 (unknown rank, see InferInput::shape): declaring a
  // scalar there would make ORT's downstream shape inference reject valid models.
  void set_output_like_input(size_t out, size_t in) const;
  // Reads the declared attribute `a` into `out`; false when the node does not set it. Throws
  // Error when it is set with another type.
  bool read_attr(const ArgDecl& a, AttrValue* out) const;
  // The symbolic names of input `index`'s dimensions ("" where a dimension has none).
  std::vector<std::string> input_symbols(size_t index) const;
  // Output `out` gets element type `type` and dimensions `dims` (-1: unknown), named by
  // `symbols` where non-empty; an unknown dimension without a name gets a fresh symbol.
  void set_output(size_t out, ONNXTensorElementDataType type, const std::vector<int64_t>& dims,
                  const std::vector<std::string>& symbols) const;

 private:
  OrtShapeInferContext* ctx_;
};

// One op as ORT sees it: a name, an execution provider, input/output types, a kernel.
struct OpSpec {
  const char* name = nullptr;
  const char* provider = nullptr;  // nullptr: CPU execution provider
  std::vector<ONNXTensorElementDataType> inputs;
  std::vector<bool> optional_inputs;  // same length as inputs
  std::vector<ONNXTensorElementDataType> outputs;
  std::vector<OrtMemType> input_mem;  // empty: all default memory
  void* (*create)(const OpSpec& spec, const OrtKernelInfo* info) = nullptr;  // may throw
  void (*compute)(void* kernel, OrtKernelContext* ctx) = nullptr;  // may throw
  void (*destroy)(void* kernel) = nullptr;
  // Output type/shape inference at model load (may throw to reject the node);
  // nullptr: output 0 has input 0's type and shape (InferIO::set_output_like_input).
  void (*infer_shape)(const OpSpec& spec, const InferIO& io) = nullptr;
  // The op's declaration and its compute function on this provider: the generic kernel hands it
  // a KernelCall.
  const OpDecl* decl = nullptr;
  ComputeFn kernel = nullptr;
  // Opset range of the domain this kernel serves. 0: from the op's first version to the
  // library's newest (the highest version any of its declared ops has), so a library refuses a
  // model newer than itself.
  int start_version = 0;
  int end_version = 0;
  // The stand-in for a misdeclared op (register_custom_ops): one variadic input and one variadic
  // output of any types, so that any node of the op reaches kernel creation, which fails naming it.
  bool any_arity = false;
};

// The OpSpecs of the registered compute function `kernel`: one per combination of its
// declaration's type variables, for the execution provider of its device. Inputs declared
// host_memory() are CPU inputs on other providers.
std::vector<OpSpec> kernel_op_specs(const OpKernel& kernel);

// What a library registers: the specs of the compute functions registered for `library`
// (nullptr: any), made on first use (one library per binary: later calls get the same).
const std::vector<OpSpec>& library_specs(const char* library);

}  // namespace opbridge::ort

// OPBRIDGE_ORT_LIBRARY(domain, library): defines the library's exported entry points:
// RegisterCustomOps (what SessionOptions.register_custom_ops_library / RegisterCustomOpsLibrary
// look up), registering all of its ops in `domain` (a const char*), and opbridge's C ABI
// (opbridge/c_abi.h: the declarations, their checks and the CPU compute functions for Python,
// without ONNX Runtime; the build's check of the declarations). `library`: the library whose
// compute functions it serves (opbridge_add_op's LIBRARY). Exactly one per library.
#define OPBRIDGE_ORT_LIBRARY(domain, library)                                                      \
  extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(  \
      OrtSessionOptions* options, const OrtApiBase* api_base) {                                    \
    return ::opbridge::ort::register_custom_ops(options, api_base, (domain), (library));           \
  }                                                                                                \
  OPBRIDGE_C_ENTRY_POINTS((domain), (library))
