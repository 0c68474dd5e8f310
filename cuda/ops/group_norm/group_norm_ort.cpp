// ORT CUDA op ai.opbridge::GroupNorm for the CUDAExecutionProvider (same inputs, attributes and
// checks as the CPU op in cpp/ops/group_norm/group_norm_ort.cpp), queued on ORT's compute stream.
// Attributes: num_groups (required), epsilon (default 1e-5), activation ("none" | "silu", since
// op version 2; default "none"). ONNX tensors are [N, C, *]: never channels_last here.
#include <string>
#include <vector>

#include "../../common/adapter_checks.h"
#include "../../common/ort_attr.h"
#include "group_norm.cuh"
#include "opbridge/group_norm.h"
#include "ort_op.h"

namespace opbridge::ort {
namespace {

template <class T>
class GroupNormCudaKernel {
 public:
  explicit GroupNormCudaKernel(const OrtKernelInfo* info) : label_(node_label(info, kGroupNormOpType)) {
    // Every attribute inside the try, so that each error names the node.
    try {
      num_groups_ = attr_int(info, "num_groups");
      epsilon_ = attr_float(info, "epsilon", 1e-5f);
      const std::string activation = cuda_attr_string(info, "activation", "none");
      const Status st = cuda_checks::parse_activation(activation, &activation_);
      if (!st.ok()) fail(ORT_INVALID_ARGUMENT, st.message());
    } catch (const Error& e) {
      fail(ORT_INVALID_ARGUMENT, label_ + ": " + e.what());
    }
  }

  void Compute(KernelIO& io) {
    const Input x = io.input(0);
    const Input scale = io.input(1);
    const Input bias = io.input(2);
    check(group_norm_check(x.rank(), x.rank() >= 2 ? x.shape[1] : 0, num_groups_,
                           scale.present ? scale.numel : -1, bias.present ? bias.numel : -1, epsilon_,
                           "scale"),
          label_);
    T* y = io.output_as<T>(0, x.shape);
    // Nothing to compute for an empty x; only then could N * C overflow (x = [2^62, 4, 0]).
    if (x.numel == 0) return;
    GroupNormDims d;
    d.N = x.shape[0];
    d.C = x.shape[1];
    d.S = x.numel / (d.N * d.C);
    d.G = num_groups_;
    // Scratch in x's (device) memory, from the CUDA EP's allocator.
    const size_t ws_bytes = cuda::group_norm_workspace_bytes<T>(d);
    const Scratch workspace = io.scratch(ws_bytes, 0);
    const cudaError_t err = cuda::launch_group_norm<T>(
        static_cast<cudaStream_t>(io.gpu_stream()), x.as<T>(), scale.present ? scale.as<T>() : nullptr,
        bias.present ? bias.as<T>() : nullptr, y, d, epsilon_, activation_, workspace.get(), ws_bytes);
    if (err != cudaSuccess) {
      fail(ORT_RUNTIME_EXCEPTION,
           label_ + ": CUDA launch failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
    }
  }

 private:
  std::string label_;
  int64_t num_groups_ = 0;
  float epsilon_ = 1e-5f;
  Activation activation_ = Activation::kNone;
};

constexpr const char* kCudaProvider = "CUDAExecutionProvider";

template <class T>
OpSpec group_norm_cuda_spec() {
  const auto t = onnx_type<T>();
  return make_op<GroupNormCudaKernel<T>>(kGroupNormOpType, kCudaProvider, {t, t, t}, {false, true, true}, {t});
}

std::vector<OpSpec> group_norm_cuda_specs() {
  return {group_norm_cuda_spec<float>(), group_norm_cuda_spec<double>(), group_norm_cuda_spec<Half>(),
          group_norm_cuda_spec<BFloat16>()};
}

}  // namespace
}  // namespace opbridge::ort

OPBRIDGE_REGISTER_ORT_OPS(opbridge::ort::group_norm_cuda_specs);
