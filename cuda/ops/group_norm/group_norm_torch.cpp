// torch op opbridge::group_norm on CUDA tensors: same declaration, checks and messages as the CPU
// implementation (cpp/ops/group_norm/group_norm_torch.cpp), queued on torch's current stream.
// Memory format as on the CPU: a channels-last x ([N, *spatial, C] memory) gives a channels-last
// result without copies (the fake kernel follows the same rule).
//
// Backward: opbridge::group_norm_backward has no CUDA kernel; on CUDA tensors it is computed by a
// composite of torch ops registered from Python (opbridge/ops/group_norm.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <string>

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

at::Tensor group_norm_cuda_impl(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, double eps, c10::string_view activation) {
  check_call(group_norm_decl(), kOp, {x, num_groups, weight, bias, eps, activation});
  const Activation act = activation_from_name(std::string(activation));
  const c10::cuda::CUDAGuard device_guard(x.device());
  const bool cl = uses_channels_last(x);
  const at::Tensor xc = cl ? x : x.contiguous();
  const auto wc = contiguous(weight), bc = contiguous(bias);
  at::Tensor y = empty_in_layout(xc, cl);
  const GroupNormDims d = group_norm_dims(x.sizes().data(), x.sizes().size(), num_groups, cl);
  if (d.S == 0) return y;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  dispatch_float(x.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    // From torch's caching allocator: freed back to it (for this stream) when `ws` dies, after
    // the kernels that use it were queued, which is what the allocator expects.
    const size_t ws_bytes = cuda::group_norm_workspace_bytes<T>(d);
    at::Tensor ws;
    if (ws_bytes > 0) ws = at::empty({static_cast<int64_t>(ws_bytes)}, x.options().dtype(at::kByte));
    const cudaError_t err =
        cuda::launch_group_norm<T>(stream, ptr<T>(xc), opt_ptr<T>(wc), opt_ptr<T>(bc), mutable_ptr<T>(y), d, eps,
                                   act, ws_bytes > 0 ? ws.mutable_data_ptr() : nullptr, ws_bytes);
    TORCH_CHECK(err == cudaSuccess, kOp, ": CUDA launch failed: ", cudaGetErrorName(err), " (",
                cudaGetErrorString(err), ")");
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(opbridge, CUDA, m) {
  m.impl("group_norm", &group_norm_cuda_impl);
}

}  // namespace opbridge::torch_adapter
