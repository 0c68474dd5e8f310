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
#include <string_view>
#include <vector>

#include "opbridge/dtype.h"
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

const char* type_name(ONNXTensorElementDataType t);
template <class T> constexpr ONNXTensorElementDataType onnx_type();
template <> constexpr ONNXTensorElementDataType onnx_type<float>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
template <> constexpr ONNXTensorElementDataType onnx_type<double>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE; }
template <> constexpr ONNXTensorElementDataType onnx_type<Half>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16; }
template <> constexpr ONNXTensorElementDataType onnx_type<BFloat16>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16; }

// Calls f(T{}) with T the opbridge element type of a floating ONNX type (float, double, Half,
// BFloat16); other types are an error (the declaration's types keep them out).
template <class F>
void dispatch_elem(ONNXTensorElementDataType t, F&& f) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: f(float{}); return;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: f(double{}); return;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: f(Half{}); return;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: f(BFloat16{}); return;
    default: fail(ORT_NOT_IMPLEMENTED, std::string("opbridge: unsupported element type ") + type_name(t));
  }
}

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
  // The symbolic name of each dimension ("" where it has none), same length as shape.
  std::vector<std::string> symbols;

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
  // Reads the declared attribute `a` into `out`; false when the node does not set it. Throws
  // Error when it is set with another type.
  bool read_attr(const ArgDecl& a, AttrValue* out) const;
  // The symbolic names of input `index`'s dimensions ("" where a dimension has none).
  std::vector<std::string> input_symbols(size_t index) const;
  // Output `out` gets element type `type` and dimensions `dims` (-1: unknown), named by
  // `symbols` where non-empty; an unknown dimension without a name gets a fresh symbol.
  void set_output(size_t out, ONNXTensorElementDataType type, const std::vector<int64_t>& dims,
                  const std::vector<std::string>& symbols) const;
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
  void* (*create)(const OpSpec& spec, const OrtKernelInfo* info) = nullptr;  // may throw
  void (*compute)(void* kernel, OrtKernelContext* ctx) = nullptr;  // may throw
  void (*destroy)(void* kernel) = nullptr;
  // Output type/shape inference at model load (may throw to reject the node);
  // nullptr: output 0 has input 0's type and shape (InferIO::set_output_like_input).
  void (*infer_shape)(const OpSpec& spec, const InferIO& io) = nullptr;
  // Declared ops (OPBRIDGE_ORT_OP): the declaration and the provider's compute function.
  const OpDecl* decl = nullptr;
  void (*declared_compute)(const struct OrtOpContext& ctx) = nullptr;
  // Or, for a registered compute function (opbridge/kernel.h), the function itself: the generic
  // kernel hands it a KernelCall.
  ComputeFn kernel = nullptr;
  // Opset range of the domain this kernel serves. 0: for a declared op, from its first version
  // to the library's newest (the highest version any of its declared ops has), so a library
  // refuses a model newer than itself; for other ops, every version.
  int start_version = 0;
  int end_version = 0;
  // The stand-in for a misdeclared op (register_custom_ops): one variadic input and one variadic
  // output of any types, so that any node of the op reaches kernel creation, which fails naming it.
  bool any_arity = false;
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
  s.create = [](const OpSpec&, const OrtKernelInfo* info) -> void* { return new K(info); };
  s.compute = [](void* k, OrtKernelContext* ctx) {
    KernelIO io(ctx);
    static_cast<K*>(k)->Compute(io);
  };
  s.destroy = [](void* k) { delete static_cast<K*>(k); };
  return s;
}

// ---- declared ops ------------------------------------------------------------------------
// What a declared op's compute function gets for one run: the validated call (types, shapes,
// attribute values, host data of host_memory inputs), the inputs' data, and the kernel context.
struct OrtOpContext {
  const KernelIO& io;
  const OpCall& call;
  const std::string& label;         // "ai.opbridge::GroupNorm (node 'gn1')", for messages
  const std::vector<Input>& inputs;  // in declaration order; present == false when omitted

  // Input `name` (its torch name in the declaration).
  const Input& in(std::string_view name) const {
    const int64_t i = call.decl().input_index(name);
    if (i < 0) fail(ORT_FAIL, label + ": the declaration has no input named '" + std::string(name) + "'");
    return inputs[static_cast<size_t>(i)];
  }

  // Allocates output `index` with the shape the declaration's rule gives (an error for an output
  // whose rule has a "?" dimension: the kernel gives that shape, output(index, shape)).
  void* output(size_t index) const;
  template <class T> T* output_as(size_t index) const { return static_cast<T*>(output(index)); }
  void* output(size_t index, const std::vector<int64_t>& shape) const { return io.output(index, shape); }
  template <class T> T* output_as(size_t index, const std::vector<int64_t>& shape) const {
    return static_cast<T*>(output(index, shape));
  }
  // Throws a non-ok status as an ORT error prefixed with the label.
  void check(const Status& status) const;
};
using OrtComputeFn = void (*)(const OrtOpContext& ctx);

// One OpSpec per combination of the declaration's type variables, for one execution provider
// (nullptr: CPU). Inputs declared host_memory() are CPU inputs on other providers.
std::vector<OpSpec> declared_op_specs(const OpDecl& decl, const char* provider, OrtComputeFn compute);

// The OpSpecs of the registered compute function `kernel` (its provider from its device).
std::vector<OpSpec> kernel_op_specs(const OpKernel& kernel);

// Every op file adds its specs here during static initialization; RegisterCustomOps reads it.
// Adding an op never edits a shared list.
std::vector<OpSpec>& op_registry();
// What a library registers: op_registry() and the specs of the compute functions registered for
// `library` (nullptr: any), made on first use (one library per binary: later calls get the same).
const std::vector<OpSpec>& library_specs(const char* library);
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

// OPBRIDGE_ORT_OP(decl, provider, compute): registers the declared op `decl()` (a function
// returning const OpDecl&) with `compute` (void(const OrtOpContext&)) for `provider` (nullptr:
// the CPU execution provider, or "CUDAExecutionProvider").
#define OPBRIDGE_ORT_OP(decl, provider, compute)                                                        \
  OPBRIDGE_REGISTER_ORT_OPS(                                                                             \
      []() -> std::vector<::opbridge::ort::OpSpec> {                                                     \
        return ::opbridge::ort::declared_op_specs((decl)(), (provider), (compute));                      \
      })

namespace opbridge::ort {
// The C entry points every library exports next to RegisterCustomOps (through
// OPBRIDGE_ORT_LIBRARY_ENTRY), for Python (opbridge/_decl.py), which loads the library with
// ctypes: no ORT needed.
struct CheckTensor {  // one input, as OpbridgeCheckCall takes it
  int32_t present;
  int32_t type;      // ONNX element type
  int64_t rank;      // -1: unknown
  const int64_t* dims;  // rank entries, -1 where unknown
  const void* data;  // host data of a host_memory input, or nullptr
};
struct CheckAttr {  // one attribute, in declaration order
  int32_t present;  // 0: the default
  int64_t i;
  double f;
  const char* s;
  int64_t n;  // number of ints / floats
  const int64_t* ints;
  const double* floats;
};
// The highest version among the library's declared ops (1 when it has none).
int declared_domain_version(const char* library = nullptr);
// The JSON description of the library's declared ops (static storage; never freed).
const char* describe_ops(const char* domain, const char* library = nullptr) noexcept;
// What is wrong with the library's misdeclared ops, one op per line ("" when nothing is; static
// storage). opbridge_add_op() runs a check on it when it builds a library (check_declarations.cpp).
const char* declaration_errors(const char* library = nullptr) noexcept;
// Checks one call of op `name` like the kernels do. Returns the StatusCode (0: ok) and writes the
// message (NUL-terminated, truncated to size) to `message`.
int32_t check_call_c(const char* name, const CheckTensor* inputs, int64_t n_inputs, const CheckAttr* attrs,
                     int64_t n_attrs, char* message, int64_t size, const char* library = nullptr) noexcept;
// Runs op `name`'s CPU compute function on host memory (opbridge._core): checks the call, asks
// `alloc` for each output (its index, ONNX element type and shape; the memory must stay valid
// until this returns), runs the kernel serially. isa: an opbridge::CpuIsa; channels_last: see
// KernelCall::channels_last (shapes are the logical ones). Returns the StatusCode (0: ok) and the
// message, as check_call_c; never throws.
using HostAlloc = void* (*)(void* ctx, int64_t output, int32_t type, int64_t rank, const int64_t* dims);
int32_t run_host_c(const char* name, const CheckTensor* inputs, int64_t n_inputs, const CheckAttr* attrs,
                   int64_t n_attrs, int32_t isa, int32_t channels_last, HostAlloc alloc, void* alloc_ctx,
                   char* message, int64_t size, const char* library = nullptr) noexcept;
}  // namespace opbridge::ort

// OPBRIDGE_ORT_LIBRARY(domain, library): defines the library's exported entry points:
// RegisterCustomOps (what SessionOptions.register_custom_ops_library / RegisterCustomOpsLibrary
// look up), registering all of its ops in `domain` (a const char*), the ones Python reads with
// ctypes (OpbridgeDescribeOps, OpbridgeCheckCall, OpbridgeRunHost) and the one the build's check
// of the declarations reads (OpbridgeDeclarationErrors). `library`: the library
// whose compute functions it serves (opbridge_add_op's LIBRARY; nullptr: all of this binary's).
// Exactly one per library.
#define OPBRIDGE_ORT_LIBRARY(domain, library)                                                      \
  extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(  \
      OrtSessionOptions* options, const OrtApiBase* api_base) {                                    \
    return ::opbridge::ort::register_custom_ops(options, api_base, (domain), (library));           \
  }                                                                                                \
  extern "C" __attribute__((visibility("default"))) const char* OpbridgeDescribeOps() {            \
    return ::opbridge::ort::describe_ops((domain), (library));                                     \
  }                                                                                                \
  extern "C" __attribute__((visibility("default"))) const char* OpbridgeDeclarationErrors() {      \
    return ::opbridge::ort::declaration_errors((library));                                         \
  }                                                                                                \
  extern "C" __attribute__((visibility("default"))) int32_t OpbridgeCheckCall(                     \
      const char* name, const ::opbridge::ort::CheckTensor* inputs, int64_t n_inputs,              \
      const ::opbridge::ort::CheckAttr* attrs, int64_t n_attrs, char* message, int64_t size) {     \
    return ::opbridge::ort::check_call_c(name, inputs, n_inputs, attrs, n_attrs, message, size,    \
                                         (library));                                               \
  }                                                                                                \
  extern "C" __attribute__((visibility("default"))) int32_t OpbridgeRunHost(                       \
      const char* name, const ::opbridge::ort::CheckTensor* inputs, int64_t n_inputs,              \
      const ::opbridge::ort::CheckAttr* attrs, int64_t n_attrs, int32_t isa, int32_t channels_last, \
      ::opbridge::ort::HostAlloc alloc, void* alloc_ctx, char* message, int64_t size) {            \
    return ::opbridge::ort::run_host_c(name, inputs, n_inputs, attrs, n_attrs, isa, channels_last, \
                                       alloc, alloc_ctx, message, size, (library));                \
  }
// The same, serving every compute function of the binary (libraries generated before
// OPBRIDGE_ORT_LIBRARY existed).
#define OPBRIDGE_ORT_LIBRARY_ENTRY(domain) OPBRIDGE_ORT_LIBRARY(domain, nullptr)
