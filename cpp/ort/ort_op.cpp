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
// A symbolic dimension name no other dimension has (unique in the process).
std::string fresh_symbol() {
  static std::atomic<uint64_t> counter{0};
  return "opbridge_unk_" + std::to_string(counter.fetch_add(1));
}

// Sets output `out` of a shape inference to `type` and `dims`, symbols[i] naming dimension i.
void set_output_shape(OrtShapeInferContext* ctx, size_t out, ONNXTensorElementDataType type,
                      const std::vector<int64_t>& dims, std::vector<const char*>& symbols) {
  OrtTensorTypeAndShapeInfo* shape = nullptr;
  check(api().CreateTensorTypeAndShapeInfo(&shape));
  std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)> holder(
      shape, [](OrtTensorTypeAndShapeInfo* p) { api().ReleaseTensorTypeAndShapeInfo(p); });
  check(api().SetTensorElementType(shape, type));
  check(api().SetDimensions(shape, dims.data(), dims.size()));
  check(api().SetSymbolicDimensions(shape, symbols.data(), symbols.size()));
  check(api().ShapeInferContext_SetOutputTypeShape(ctx, out, shape));
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
  set_output_shape(ctx_, out, type, dims, symbol_ptrs);
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
  set_output_shape(ctx_, out, type, values, name_ptrs);
}

}  // namespace opbridge::ort
