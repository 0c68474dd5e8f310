// ORT CUDA op ai.opbridge::MultiScaleDeformableAttention for the CUDAExecutionProvider, queued on
// ORT's compute stream. Inputs: value (N, S, M, D), spatial_shapes (L, 2) int64,
// level_start_index (L,) int64, sampling_locations (N, Lq, M, L, P, 2), attention_weights
// (N, Lq, M, L, P); output (N, Lq, M * D). No attributes.
//
// spatial_shapes and level_start_index are declared CPU-memory inputs (OrtMemTypeCPUInput): ORT
// keeps or copies them on the host, so validating them and handing them to the kernels by value
// needs no device-to-host copy and no synchronization here.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "../../common/adapter_checks.h"
#include "ms_deform_attn.cuh"
#include "opbridge/ms_deform_attn.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

constexpr const char* kOpType = "MultiScaleDeformableAttention";
constexpr const char* kCudaProvider = "CUDAExecutionProvider";

template <class T>
class MsDeformAttnCudaKernel {
 public:
  explicit MsDeformAttnCudaKernel(const OrtKernelInfo* info) : label_(node_label(info, kOpType)) {}

  void Compute(KernelIO& io) {
    const Input value = io.input(0);
    const Input shapes = io.input(1);
    const Input starts = io.input(2);
    const Input loc = io.input(3);
    const Input attn = io.input(4);
    MsDeformAttnDims d;
    check(cuda_checks::ms_deform_attn_check_shapes(value.shape.data(), value.rank(), shapes.shape.data(),
                                                   shapes.rank(), starts.shape.data(), starts.rank(),
                                                   loc.shape.data(), loc.rank(), attn.shape.data(), attn.rank(), &d),
          label_);
    // Host memory (OrtMemTypeCPUInput), so readable here.
    check(cuda_checks::ms_deform_attn_check_levels(d, shapes.as<int64_t>(), starts.as<int64_t>()), label_);
    T* out = io.output_as<T>(0, {d.N, d.Lq, d.M * d.D});
    const cudaError_t err =
        cuda::launch_ms_deform_attn<T>(static_cast<cudaStream_t>(io.gpu_stream()), value.as<T>(),
                                       shapes.as<int64_t>(), starts.as<int64_t>(), loc.as<T>(), attn.as<T>(), out, d);
    if (err != cudaSuccess) {
      fail(ORT_RUNTIME_EXCEPTION,
           label_ + ": CUDA launch failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
    }
  }

 private:
  std::string label_;
};

// Dimension i of input `in` as (value, symbol): value -1 when unknown, symbol "" when none.
struct Dim {
  int64_t value = -1;
  std::string symbol;
};

std::vector<Dim> input_dims(const InferIO& io, size_t in) {
  OrtTensorTypeAndShapeInfo* info = nullptr;  // owned by the context: never released
  check(api().ShapeInferContext_GetInputTypeShape(io.raw(), in, &info));
  size_t rank = 0;
  check(api().GetDimensionsCount(info, &rank));
  std::vector<int64_t> values(rank);
  std::vector<const char*> names(rank, nullptr);
  check(api().GetDimensions(info, values.data(), rank));
  check(api().GetSymbolicDimensions(info, names.data(), rank));
  std::vector<Dim> dims(rank);
  for (size_t i = 0; i < rank; ++i) {
    dims[i].value = values[i] < 0 ? -1 : values[i];
    if (names[i] != nullptr) dims[i].symbol = names[i];
  }
  return dims;
}

// Output (N, Lq, M * D) with value's type. Unknown dimensions keep the input's symbol, or get a
// fresh one of their own (a dimension without a symbol would be written as a literal -1).
void infer(const InferIO& io) {
  const InferInput value = io.input(0);
  const InferInput loc = io.input(3);
  if (value.rank() == 0 || loc.rank() == 0) return;  // rank unknown
  if (value.rank() != 4 || loc.rank() != 6) {
    fail(ORT_INVALID_ARGUMENT, std::string("ai.opbridge::") + kOpType +
                                   ": value must have rank 4 and sampling_locations rank 6, got ranks " +
                                   std::to_string(value.rank()) + " and " + std::to_string(loc.rank()));
  }
  const std::vector<Dim> vd = input_dims(io, 0), ld = input_dims(io, 3);
  // N: from either input, a known size first, else a symbol.
  Dim n = ld[0];
  if (n.value < 0 && (vd[0].value >= 0 || n.symbol.empty())) n = vd[0];
  std::vector<Dim> out = {n, ld[1], Dim{}};
  if (vd[2].value >= 0 && vd[3].value >= 0) out[2].value = vd[2].value * vd[3].value;
  std::vector<int64_t> values(3);
  std::vector<std::string> symbols(3);
  std::vector<const char*> symbol_ptrs(3);
  for (size_t i = 0; i < 3; ++i) {
    values[i] = out[i].value;
    symbols[i] = out[i].symbol;
    if (values[i] < 0 && symbols[i].empty()) {
      static std::atomic<uint64_t> counter{0};
      symbols[i] = "opbridge_msda_unk_" + std::to_string(counter.fetch_add(1));
    }
    symbol_ptrs[i] = symbols[i].c_str();
  }
  OrtTensorTypeAndShapeInfo* shape = nullptr;
  check(api().CreateTensorTypeAndShapeInfo(&shape));
  std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)> holder(
      shape, [](OrtTensorTypeAndShapeInfo* p) { api().ReleaseTensorTypeAndShapeInfo(p); });
  check(api().SetTensorElementType(shape, value.type));
  check(api().SetDimensions(shape, values.data(), values.size()));
  check(api().SetSymbolicDimensions(shape, symbol_ptrs.data(), symbol_ptrs.size()));
  check(api().ShapeInferContext_SetOutputTypeShape(io.raw(), 0, shape));
}

template <class T>
OpSpec ms_deform_attn_cuda_spec() {
  const auto t = onnx_type<T>();
  constexpr auto i64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  OpSpec s = make_op<MsDeformAttnCudaKernel<T>>(kOpType, kCudaProvider, {t, i64, i64, t, t},
                                                {false, false, false, false, false}, {t});
  s.input_mem = {OrtMemTypeDefault, OrtMemTypeCPUInput, OrtMemTypeCPUInput, OrtMemTypeDefault, OrtMemTypeDefault};
  s.infer_shape = &infer;
  return s;
}

std::vector<OpSpec> ms_deform_attn_cuda_specs() {
  return {ms_deform_attn_cuda_spec<float>(), ms_deform_attn_cuda_spec<double>(), ms_deform_attn_cuda_spec<Half>(),
          ms_deform_attn_cuda_spec<BFloat16>()};
}

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_REGISTER_ORT_OPS(opbridge::ort::ms_deform_attn_cuda_specs);
