// torch op opbridge::group_norm on CUDA tensors: same schema, checks and messages as the CPU
// implementation (cpp/ops/group_norm/group_norm_torch.cpp), queued on torch's current stream.
//
// Backward: opbridge::group_norm_backward has no CUDA kernel; on CUDA tensors it is computed by a
// composite of torch ops registered from Python (opbridge/ops/group_norm.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/silu.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "group_norm.cuh"
#include "opbridge/group_norm.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::group_norm";

std::optional<at::Tensor> contiguous(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return t->contiguous();
}

// The CUDA launcher computes [N, C, S] without activation: a channels-last x is made contiguous
// and the result restored to x's memory format (the rule of the CPU op and its fake kernel:
// opbridge/ops/group_norm.py), SiLU is applied afterwards. Both cost copies until the launcher
// takes GroupNormDims and Activation.
bool use_channels_last(const at::Tensor& x) {
  if (x.dim() < 3 || x.is_contiguous()) return false;
  std::vector<int64_t> order{0};
  for (int64_t i = 2; i < x.dim(); ++i) order.push_back(i);
  order.push_back(1);
  return x.permute(order).is_contiguous();
}

at::Tensor group_norm_cuda_impl(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, double eps, c10::string_view activation) {
  check_call(group_norm_decl(), kOp, {x, num_groups, weight, bias, eps, activation});
  TORCH_CHECK_NOT_IMPLEMENTED(activation == "none", kOp, ": activation '", activation,
                              "' is not implemented by this build");
  const GroupNormDims d = group_norm_dims({x.sizes().begin(), x.sizes().end()}, num_groups);
  const int64_t N = d.N, C = d.C, S = d.S;

  const c10::cuda::CUDAGuard device_guard(x.device());
  const at::Tensor xc = x.contiguous();
  const auto wc = contiguous(weight), bc = contiguous(bias);
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  if (y.numel() == 0) return y;
  const bool cl = use_channels_last(x);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  dispatch_float(x.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    // From torch's caching allocator: freed back to it (for this stream) when `ws` dies, after
    // the kernels that use it were queued, which is what the allocator expects.
    const size_t ws_bytes = cuda::group_norm_workspace_bytes<T>(N, C, S, d.G);
    at::Tensor ws;
    if (ws_bytes > 0) ws = at::empty({static_cast<int64_t>(ws_bytes)}, x.options().dtype(at::kByte));
    const cudaError_t err = cuda::launch_group_norm<T>(stream, ptr<T>(xc), opt_ptr<T>(wc), opt_ptr<T>(bc),
                                                       mutable_ptr<T>(y), N, C, S, d.G, eps,
                                                       ws_bytes > 0 ? ws.mutable_data_ptr() : nullptr, ws_bytes);
    TORCH_CHECK(err == cudaSuccess, kOp, ": CUDA launch failed: ", cudaGetErrorName(err), " (",
                cudaGetErrorString(err), ")");
  });
  if (act == Activation::kSilu) at::silu_(y);
  if (cl) {
    // x's strides: channels-last ([N, *spatial, C] memory).
    std::vector<int64_t> order{0};
    for (int64_t i = 2; i < x.dim(); ++i) order.push_back(i);
    order.push_back(1);
    std::vector<int64_t> inverse(order.size());
    for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
    return y.permute(order).contiguous().permute(inverse);
  }
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(opbridge, CUDA, m) {
  m.impl("group_norm", &group_norm_cuda_impl);
}

}  // namespace opbridge::torch_adapter
