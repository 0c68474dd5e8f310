// opbridge ORT adapter layer: turns a small C++ kernel class into an OrtCustomOp.
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
#include <vector>

#include "opbridge/dtype.h"
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
// runtime's and these headers', at least kMinOrtApiVersion) and adds every op of op_registry()
// to `options` in the custom-op domain `domain`. Returns nullptr on success, else an error
// status (ORT releases it); never throws. A library uses one domain for all its calls.
//   options:  the session options to register with (nullptr: nothing is done)
//   api_base: what ORT passed to RegisterCustomOps (nullptr: nothing is done)
//   domain:   the ONNX domain of the library's nodes, e.g. kDomain; non-empty
OrtStatus* register_custom_ops(OrtSessionOptions* options, const OrtApiBase* api_base,
                               const char* domain) noexcept;

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

const char* type_name(ONNXTensorElementDataType t);
template <class T> constexpr ONNXTensorElementDataType onnx_type();
template <> constexpr ONNXTensorElementDataType onnx_type<float>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
template <> constexpr ONNXTensorElementDataType onnx_type<double>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE; }
template <> constexpr ONNXTensorElementDataType onnx_type<Half>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16; }
template <> constexpr ONNXTensorElementDataType onnx_type<BFloat16>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16; }

// Read-only view of one kernel input.
struct Input {
  bool present = false;  // false for an omitted optional input
  const void* data = nullptr;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> shape;
  int64_t numel = 0;

  template <class T> const T* as() const { return static_cast<const T*>(data); }
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
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
  OrtKernelContext* raw() const { return ctx_; }

 private:
  OrtKernelContext* ctx_;
};

// Attribute readers for kernel construction. An attribute present with another type is an error
// (ORT_INVALID_ARGUMENT), never a silent fallback.
int64_t attr_int(const OrtKernelInfo* info, const char* name);  // required
int64_t attr_int(const OrtKernelInfo* info, const char* name, int64_t fallback);
float attr_float(const OrtKernelInfo* info, const char* name, float fallback);
std::string attr_string(const OrtKernelInfo* info, const char* name, const std::string& fallback);
// "Op 'name'" prefix for messages, with the node name where ORT provides it.
std::string node_label(const OrtKernelInfo* info, const char* op_type);

// Type and shape of one input during ORT's shape inference (model load).
struct InferInput {
  bool present = false;  // false for an omitted optional input
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  // Dimensions, -1 where symbolic or unknown. ORT reports an input of unknown rank as rank 0,
  // so an empty `shape` means "rank unknown" for inputs that cannot be scalars.
  std::vector<int64_t> shape;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  // Number of elements when every dimension is known, else -1.
  int64_t static_numel() const;
};

// What an op's shape-inference function sees: its inputs, attributes and outputs.
class InferIO {
 public:
  explicit InferIO(OrtShapeInferContext* ctx) : ctx_(ctx) {}
  size_t input_count() const;
  InferInput input(size_t index) const;
  int64_t attr_int(const char* name) const;  // required
  int64_t attr_int(const char* name, int64_t fallback) const;
  float attr_float(const char* name, float fallback) const;
  // Output `out` gets input `in`'s element type and shape, symbolic dimensions included.
  // Does nothing when input `in` has rank 0 (unknown rank, see InferInput::shape): declaring a
  // scalar there would make ORT's downstream shape inference reject valid models.
  void set_output_like_input(size_t out, size_t in) const;
  OrtShapeInferContext* raw() const { return ctx_; }

 private:
  OrtShapeInferContext* ctx_;
};

// One op as ORT sees it: a name, an execution provider, input/output types, a kernel class.
struct OpSpec {
  const char* name = nullptr;
  const char* provider = nullptr;  // nullptr: CPU execution provider
  std::vector<ONNXTensorElementDataType> inputs;
  std::vector<bool> optional_inputs;  // same length as inputs
  std::vector<ONNXTensorElementDataType> outputs;
  std::vector<OrtMemType> input_mem;  // empty: all default memory
  void* (*create)(const OrtKernelInfo* info) = nullptr;  // may throw
  void (*compute)(void* kernel, OrtKernelContext* ctx) = nullptr;  // may throw
  void (*destroy)(void* kernel) = nullptr;
  // Output type/shape inference at model load (may throw to reject the node);
  // nullptr: output 0 has input 0's type and shape (InferIO::set_output_like_input).
  void (*infer_shape)(const InferIO& io) = nullptr;
};

// Builds an OpSpec for kernel class K: K(const OrtKernelInfo*) and void Compute(KernelIO&).
template <class K>
OpSpec make_op(const char* name, const char* provider, std::vector<ONNXTensorElementDataType> inputs,
               std::vector<bool> optional_inputs, std::vector<ONNXTensorElementDataType> outputs) {
  OpSpec s;
  s.name = name;
  s.provider = provider;
  s.inputs = std::move(inputs);
  s.optional_inputs = std::move(optional_inputs);
  s.outputs = std::move(outputs);
  s.create = [](const OrtKernelInfo* info) -> void* { return new K(info); };
  s.compute = [](void* k, OrtKernelContext* ctx) {
    KernelIO io(ctx);
    static_cast<K*>(k)->Compute(io);
  };
  s.destroy = [](void* k) { delete static_cast<K*>(k); };
  return s;
}

// Every op file adds its specs here during static initialization; RegisterCustomOps reads it.
// Adding an op never edits a shared list.
std::vector<OpSpec>& op_registry();
struct OpRegistrar {
  explicit OpRegistrar(std::vector<OpSpec> (*make)()) {
    for (auto& s : make()) op_registry().push_back(std::move(s));
  }
};

}  // namespace opbridge::ort

#define OPBRIDGE_ORT_CONCAT_(a, b) a##b
#define OPBRIDGE_ORT_CONCAT(a, b) OPBRIDGE_ORT_CONCAT_(a, b)
// OPBRIDGE_REGISTER_ORT_OPS(fn): fn() returns the std::vector<OpSpec> of one op file.
#define OPBRIDGE_REGISTER_ORT_OPS(fn) \
  static const ::opbridge::ort::OpRegistrar OPBRIDGE_ORT_CONCAT(opbridge_ort_registrar_, __LINE__)(fn)

// OPBRIDGE_ORT_LIBRARY_ENTRY(domain): defines the library's exported entry point
// RegisterCustomOps (what SessionOptions.register_custom_ops_library / RegisterCustomOpsLibrary
// look up), registering all of its ops in `domain` (a const char*). Exactly one per library.
#define OPBRIDGE_ORT_LIBRARY_ENTRY(domain)                                                        \
  extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps( \
      OrtSessionOptions* options, const OrtApiBase* api_base) {                                   \
    return ::opbridge::ort::register_custom_ops(options, api_base, (domain));                     \
  }
