// torch op opbridge::group_norm on CUDA tensors: same schema, checks and messages as the CPU
// implementation (cpp/ops/group_norm/group_norm_torch.cpp), queued on torch's current stream.
//
// Layout: a channels_last (NHWC) or channels_last_3d (NDHWC) x is read in place and y gets the
// same memory format (no copy either way); any other non-contiguous x is copied to a contiguous
// one and y is contiguous.
//
// Backward: opbridge::group_norm_backward has no CUDA kernel; on CUDA tensors it is computed by a
// composite of torch ops registered from Python (opbridge/ops/group_norm.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <string_view>

#include "../../common/adapter_checks.h"
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

// Whether x is dense in channels_last order (NHWC for rank 4, NDHWC for rank 5).
bool is_channels_last(const at::Tensor& x) {
  return (x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast)) ||
         (x.dim() == 5 && x.is_contiguous(at::MemoryFormat::ChannelsLast3d));
}

at::Tensor group_norm_cuda_impl(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, double eps, c10::string_view activation) {
  check_float_dtype(x, kOp, "x");
  check_param(weight, x, kOp, "weight");  // also checks weight is on x's device
  check_param(bias, x, kOp, "bias");
  const auto len = [](const std::optional<at::Tensor>& p) {
    return p.has_value() && p->defined() ? p->numel() : int64_t{-1};
  };
  check_status(group_norm_check(x.dim(), x.dim() >= 2 ? x.size(1) : 0, num_groups, len(weight), len(bias), eps),
               kOp);
  Activation act = Activation::kNone;
  check_status(cuda_checks::parse_activation(activation, &act), kOp);

  const c10::cuda::CUDAGuard device_guard(x.device());
  // A contiguous x takes the [N, C, S] kernels even when it is also channels_last (C == 1 or
  // S == 1: the same memory either way).
  const bool channels_last = !x.is_contiguous() && is_channels_last(x);
  const at::Tensor xc = channels_last ? x : x.contiguous();
  const auto wc = contiguous(weight), bc = contiguous(bias);
  // Preserve: xc is dense, so y gets xc's strides (its memory format).
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Preserve);
  if (y.numel() == 0) return y;
  GroupNormDims d;
  d.N = x.size(0);
  d.C = x.size(1);
  d.S = x.numel() / (d.N * d.C);  // x is not empty here, so N * C does not overflow
  d.G = num_groups;
  d.channels_last = channels_last;
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
