// opbridge ORT adapter layer: helpers shared by every ORT op (see ort_op.h).
#include "ort_op.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace opbridge::ort {

namespace {
const OrtApi* g_api = nullptr;
uint32_t g_api_version = 0;
}  // namespace

const OrtApi& api() { return *g_api; }
uint32_t api_version() { return g_api_version; }
void set_api(const OrtApi* a, uint32_t version) {
  g_api = a;
  g_api_version = version;
}

void fail(OrtErrorCode code, const std::string& message) { throw Error(code, message); }

void check(OrtStatus* status) {
  if (status == nullptr) return;
  const OrtErrorCode code = api().GetErrorCode(status);
  std::string message = api().GetErrorMessage(status);
  api().ReleaseStatus(status);
  throw Error(code, std::move(message));
}

void check(const Status& status, const std::string& where) {
  if (status.ok()) return;
  OrtErrorCode code = ORT_FAIL;
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kTypeError: code = ORT_INVALID_ARGUMENT; break;
    case StatusCode::kNotImplemented: code = ORT_NOT_IMPLEMENTED; break;
    default: code = ORT_RUNTIME_EXCEPTION; break;
  }
  throw Error(code, where + ": " + status.message());
}

const char* type_name(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return "int16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
    default: return "other";
  }
}

size_t KernelIO::input_count() const {
  size_t n = 0;
  check(api().KernelContext_GetInputCount(ctx_, &n));
  return n;
}

Input KernelIO::input(size_t index) const {
  Input in;
  if (index >= input_count()) return in;
  const OrtValue* value = nullptr;
  check(api().KernelContext_GetInput(ctx_, index, &value));
  if (value == nullptr) return in;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(api().GetTensorTypeAndShape(value, &info));
  // Release `info` on every path, including a throwing one.
  std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)> holder(
      info, [](OrtTensorTypeAndShapeInfo* p) { api().ReleaseTensorTypeAndShapeInfo(p); });
  check(api().GetTensorElementType(info, &in.type));
  size_t rank = 0;
  check(api().GetDimensionsCount(info, &rank));
  in.shape.resize(rank);
  check(api().GetDimensions(info, in.shape.data(), rank));
  size_t count = 0;
  check(api().GetTensorShapeElementCount(info, &count));
  in.numel = static_cast<int64_t>(count);
  void* data = nullptr;
  check(api().GetTensorMutableData(const_cast<OrtValue*>(value), &data));
  in.data = data;
  in.present = true;
  return in;
}

void* KernelIO::output(size_t index, const std::vector<int64_t>& shape) const {
  OrtValue* value = nullptr;
  check(api().KernelContext_GetOutput(ctx_, index, shape.data(), shape.size(), &value));
  void* data = nullptr;
  check(api().GetTensorMutableData(value, &data));
  return data;
}

namespace {
struct ChunkJob {
  ParallelFor::Body body;
  void* body_ctx;
  int64_t n;
  int64_t chunk;
};

void run_chunk(void* user, size_t i) {
  auto* job = static_cast<ChunkJob*>(user);
  const int64_t b = static_cast<int64_t>(i) * job->chunk;
  const int64_t e = std::min(job->n, b + job->chunk);
  if (b < e) job->body(job->body_ctx, b, e);
}

// Upper bound on tasks handed to ORT's pool per call: enough to balance a many-core pool,
// few enough that per-task overhead (~1 us) stays negligible.
constexpr int64_t kMaxTasks = 256;

void ort_runner(void* self, int64_t n, int64_t grain, ParallelFor::Body body, void* body_ctx) {
  int64_t tasks = std::min<int64_t>((n + grain - 1) / grain, kMaxTasks);
  ChunkJob job{body, body_ctx, n, (n + tasks - 1) / tasks};
  tasks = (n + job.chunk - 1) / job.chunk;
  OrtStatus* st = api().KernelContext_ParallelFor(static_cast<OrtKernelContext*>(self), run_chunk,
                                                   static_cast<size_t>(tasks), 0, &job);
  if (st != nullptr) {
    // No pool available: run inline.
    api().ReleaseStatus(st);
    body(body_ctx, 0, n);
  }
}
}  // namespace

ParallelFor KernelIO::parallel() const { return ParallelFor(ort_runner, ctx_); }

void* KernelIO::gpu_stream() const {
  void* stream = nullptr;
  check(api().KernelContext_GetGPUComputeStream(ctx_, &stream));
  return stream;
}

Scratch& Scratch::operator=(Scratch&& o) noexcept {
  if (this != &o) {
    reset();
    allocator_ = o.allocator_;
    data_ = o.data_;
    o.allocator_ = nullptr;
    o.data_ = nullptr;
  }
  return *this;
}

void Scratch::reset() noexcept {
  if (allocator_ == nullptr) return;
  if (data_ != nullptr) allocator_->Free(allocator_, data_);
  api().ReleaseAllocator(allocator_);
  allocator_ = nullptr;
  data_ = nullptr;
}

Scratch KernelIO::scratch(size_t bytes, size_t like_input) const {
  if (bytes == 0) return {};
  const OrtValue* value = nullptr;
  check(api().KernelContext_GetInput(ctx_, like_input, &value));
  if (value == nullptr) fail(ORT_INVALID_ARGUMENT, "opbridge: scratch memory modeled on a missing input");
  const OrtMemoryInfo* mem = nullptr;  // owned by the value
  check(api().GetTensorMemoryInfo(value, &mem));
  OrtAllocator* allocator = nullptr;
  check(api().KernelContext_GetAllocator(ctx_, mem, &allocator));
  // Released on every path, including an exception out of Alloc.
  std::unique_ptr<OrtAllocator, void (*)(OrtAllocator*)> owner(
      allocator, [](OrtAllocator* a) { api().ReleaseAllocator(a); });
  void* data = allocator->Alloc(allocator, bytes);
  if (data == nullptr) {
    fail(ORT_FAIL, "opbridge: could not allocate " + std::to_string(bytes) + " bytes of scratch memory");
  }
  return Scratch(owner.release(), data);
}

namespace {
// The type of attribute `name` when the node has it with another type than the one asked for, else
// nullptr. ORT reports "missing" and "wrong type" alike (ORT_FAIL), so probe the other getters: a
// wrong type must be an error, not a silent fallback to the default (epsilon=0 written as an int
// would otherwise run with 1e-5).
const char* other_attr_type(const OrtKernelInfo* info, const char* name) {
  const auto ok = [](OrtStatus* st) {
    if (st == nullptr) return true;
    api().ReleaseStatus(st);
    return false;
  };
  int64_t i = 0;
  float f = 0.f;
  size_t size = 0;
  if (ok(api().KernelInfoGetAttribute_int64(info, name, &i))) return "an int";
  if (ok(api().KernelInfoGetAttribute_float(info, name, &f))) return "a float";
  if (ok(api().KernelInfoGetAttribute_string(info, name, nullptr, &size))) return "a string";
  size = 0;
  if (ok(api().KernelInfoGetAttributeArray_int64(info, name, nullptr, &size))) return "a list of ints";
  size = 0;
  if (ok(api().KernelInfoGetAttributeArray_float(info, name, nullptr, &size))) return "a list of floats";
  return nullptr;
}

[[noreturn]] void fail_attr_type(const char* name, const char* expected, const char* got) {
  fail(ORT_INVALID_ARGUMENT, std::string("attribute '") + name + "' must be " + expected + ", got " + got);
}
}  // namespace

int64_t attr_int(const OrtKernelInfo* info, const char* name) {
  int64_t v = 0;
  OrtStatus* st = api().KernelInfoGetAttribute_int64(info, name, &v);
  if (st != nullptr) {
    api().ReleaseStatus(st);
    if (const char* got = other_attr_type(info, name)) fail_attr_type(name, "an int", got);
    fail(ORT_INVALID_ARGUMENT, std::string("required int attribute '") + name + "' is missing");
  }
  return v;
}

int64_t attr_int(const OrtKernelInfo* info, const char* name, int64_t fallback) {
  int64_t v = 0;
  OrtStatus* st = api().KernelInfoGetAttribute_int64(info, name, &v);
  if (st != nullptr) {
    api().ReleaseStatus(st);
    if (const char* got = other_attr_type(info, name)) fail_attr_type(name, "an int", got);
    return fallback;
  }
  return v;
}

float attr_float(const OrtKernelInfo* info, const char* name, float fallback) {
  float v = 0.f;
  OrtStatus* st = api().KernelInfoGetAttribute_float(info, name, &v);
  if (st != nullptr) {
    api().ReleaseStatus(st);
    if (const char* got = other_attr_type(info, name)) fail_attr_type(name, "a float", got);
    return fallback;
  }
  return v;
}

std::string attr_string(const OrtKernelInfo* info, const char* name, const std::string& fallback) {
  size_t size = 0;
  OrtStatus* st = api().KernelInfoGetAttribute_string(info, name, nullptr, &size);
  if (st != nullptr) {
    api().ReleaseStatus(st);
    if (const char* got = other_attr_type(info, name)) fail_attr_type(name, "a string", got);
    return fallback;
  }
  std::string v(size, '\0');
  check(api().KernelInfoGetAttribute_string(info, name, v.data(), &size));
  v.resize(std::strlen(v.c_str()));  // size counts the terminating NUL
  return v;
}

std::string node_label(const OrtKernelInfo* info, const char* op_type) {
  std::string label = std::string(domain()) + "::" + op_type;
  size_t size = 0;
  OrtStatus* st = api().KernelInfo_GetNodeName(info, nullptr, &size);
  if (st != nullptr) {
    api().ReleaseStatus(st);
    return label;
  }
  std::string name(size, '\0');
  st = api().KernelInfo_GetNodeName(info, name.data(), &size);
  if (st != nullptr) {
    api().ReleaseStatus(st);
    return label;
  }
  name.resize(std::strlen(name.c_str()));
  if (!name.empty()) label += " (node '" + name + "')";
  return label;
}

int64_t InferInput::static_numel() const {
  // Declared shapes come from the model and may be absurd ([2^62, 2^62]): a product that
  // overflows int64 is "unknown" here (ORT refuses such a tensor when it is fed).
  for (int64_t d : shape) {
    if (d < 0) return -1;
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

size_t InferIO::input_count() const {
  size_t n = 0;
  check(api().ShapeInferContext_GetInputCount(ctx_, &n));
  return n;
}

InferInput InferIO::input(size_t index) const {
  InferInput in;
  if (index >= input_count()) return in;
  // The context owns the info it hands out (it lives as long as the context): never release it.
  OrtTensorTypeAndShapeInfo* info = nullptr;
  OrtStatus* st = api().ShapeInferContext_GetInputTypeShape(ctx_, index, &info);
  if (st != nullptr) {
    // An omitted optional input has no type to report.
    api().ReleaseStatus(st);
    return in;
  }
  check(api().GetTensorElementType(info, &in.type));
  if (in.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED) return in;
  size_t rank = 0;
  check(api().GetDimensionsCount(info, &rank));
  in.shape.resize(rank);
  check(api().GetDimensions(info, in.shape.data(), rank));
  for (int64_t& d : in.shape) {
    if (d < 0) d = -1;
  }
  std::vector<const char*> names(rank, nullptr);
  if (rank > 0) check(api().GetSymbolicDimensions(info, names.data(), rank));
  in.symbols.resize(rank);
  for (size_t i = 0; i < rank; ++i) {
    if (names[i] != nullptr) in.symbols[i] = names[i];
  }
  in.present = true;
  return in;
}

namespace {
// The attribute `name` of the node being inferred, or nullptr when it is not set.
const OrtOpAttr* infer_attr(OrtShapeInferContext* ctx, const char* name) {
  const OrtOpAttr* attr = nullptr;
  OrtStatus* st = api().ShapeInferContext_GetAttribute(ctx, name, &attr);
  if (st != nullptr) {
    api().ReleaseStatus(st);
    return nullptr;
  }
  return attr;
}
}  // namespace

int64_t InferIO::attr_int(const char* name) const {
  if (infer_attr(ctx_, name) == nullptr) {
    fail(ORT_INVALID_ARGUMENT, std::string("required int attribute '") + name + "' is missing");
  }
  return attr_int(name, 0);
}

int64_t InferIO::attr_int(const char* name, int64_t fallback) const {
  const OrtOpAttr* attr = infer_attr(ctx_, name);
  if (attr == nullptr) return fallback;
  int64_t v = 0;
  size_t written = 0;
  OrtStatus* st = api().ReadOpAttr(attr, ORT_OP_ATTR_INT, &v, sizeof(v), &written);
  if (st != nullptr) {
    api().ReleaseStatus(st);
    fail(ORT_INVALID_ARGUMENT, std::string("attribute '") + name + "' must be an int");
  }
  return v;
}

float InferIO::attr_float(const char* name, float fallback) const {
  const OrtOpAttr* attr = infer_attr(ctx_, name);
  if (attr == nullptr) return fallback;
  float v = 0.f;
  size_t written = 0;
  OrtStatus* st = api().ReadOpAttr(attr, ORT_OP_ATTR_FLOAT, &v, sizeof(v), &written);
  if (st != nullptr) {
    api().ReleaseStatus(st);
    fail(ORT_INVALID_ARGUMENT, std::string("attribute '") + name + "' must be a float");
  }
  return v;
}

namespace {
// A symbolic dimension name no other dimension has (unique in the process).
std::string fresh_symbol() {
  static std::atomic<uint64_t> counter{0};
  return "opbridge_unk_" + std::to_string(counter.fetch_add(1));
}
}  // namespace

void InferIO::set_output_like_input(size_t out, size_t in) const {
  // Context-owned, like in input(): never released.
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(api().ShapeInferContext_GetInputTypeShape(ctx_, in, &info));
  size_t rank = 0;
  check(api().GetDimensionsCount(info, &rank));
  if (rank == 0) return;
  // ORT (1.17 to 1.31) writes a dimension without a symbolic name as dim_value, so an unknown
  // dimension (-1) handed back unchanged becomes a literal -1: its optimizer then folds a
  // downstream Shape(Y) into the constant [-1, ...]. Give every unknown dimension a symbol of its
  // own instead (unique, so that no two unknown dimensions are taken as equal).
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  check(api().GetTensorElementType(info, &type));
  std::vector<int64_t> dims(rank);
  check(api().GetDimensions(info, dims.data(), rank));
  std::vector<const char*> names(rank, nullptr);
  check(api().GetSymbolicDimensions(info, names.data(), rank));
  std::vector<std::string> symbols(rank);
  std::vector<const char*> symbol_ptrs(rank);
  for (size_t i = 0; i < rank; ++i) {
    if (names[i] != nullptr && names[i][0] != '\0') {
      symbols[i] = names[i];
    } else if (dims[i] < 0) {
      symbols[i] = fresh_symbol();
    }
    symbol_ptrs[i] = symbols[i].c_str();
  }
  OrtTensorTypeAndShapeInfo* shape = nullptr;
  check(api().CreateTensorTypeAndShapeInfo(&shape));
  std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)> holder(
      shape, [](OrtTensorTypeAndShapeInfo* p) { api().ReleaseTensorTypeAndShapeInfo(p); });
  check(api().SetTensorElementType(shape, type));
  check(api().SetDimensions(shape, dims.data(), rank));
  check(api().SetSymbolicDimensions(shape, symbol_ptrs.data(), rank));
  check(api().ShapeInferContext_SetOutputTypeShape(ctx_, out, shape));
}

void InferIO::set_output(size_t out, ONNXTensorElementDataType type, const std::vector<int64_t>& dims,
                         const std::vector<std::string>& symbols) const {
  const size_t rank = dims.size();
  std::vector<int64_t> values(dims);
  std::vector<std::string> names(rank);
  std::vector<const char*> name_ptrs(rank);
  for (size_t i = 0; i < rank; ++i) {
    if (values[i] < 0) {
      values[i] = -1;
      // An unnamed unknown dimension gets a symbol of its own: see set_output_like_input.
      names[i] = i < symbols.size() && !symbols[i].empty() ? symbols[i] : fresh_symbol();
    }
    name_ptrs[i] = names[i].c_str();
  }
  OrtTensorTypeAndShapeInfo* shape = nullptr;
  check(api().CreateTensorTypeAndShapeInfo(&shape));
  std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)> holder(
      shape, [](OrtTensorTypeAndShapeInfo* p) { api().ReleaseTensorTypeAndShapeInfo(p); });
  check(api().SetTensorElementType(shape, type));
  check(api().SetDimensions(shape, values.data(), rank));
  check(api().SetSymbolicDimensions(shape, name_ptrs.data(), rank));
  check(api().ShapeInferContext_SetOutputTypeShape(ctx_, out, shape));
}

std::vector<OpSpec>& op_registry() {
  static std::vector<OpSpec> registry;
  return registry;
}

}  // namespace opbridge::ort
