// torch op opbridge::group_norm on CUDA tensors, on the stable ABI: same declaration, checks and
// messages as the CPU implementation (cpp/ops/group_norm/group_norm_torch.cpp), queued on torch's
// current stream (the C shim's aoti_torch_get_current_cuda_stream). Memory format as on the CPU: a
// channels-last x ([N, *spatial, C] memory) gives a channels-last result without copies (the fake
// kernel follows the same rule).
//
// Backward: opbridge::group_norm_backward has no CUDA kernel; on CUDA tensors it is computed by a
// composite of torch ops registered from Python (opbridge/ops/group_norm.py).
#include <torch/csrc/stable/accelerator.h>

#include <string>

#include "group_norm.cuh"
#include "opbridge/group_norm.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::group_norm";

Tensor contiguous_or_undefined(const Tensor& t) { return t.defined() ? contiguous(t) : t; }

void group_norm_cuda_impl(TorchCall& c) {
  const Tensor& x = c.in("x");
  const int64_t num_groups = c.call().attr_int("num_groups");
  const double eps = c.call().attr_float("eps");
  const Activation act = activation_from_name(c.call().attr_string("activation"));
  const torch::stable::accelerator::DeviceGuard device_guard(x.get_device_index());
  const bool cl = uses_channels_last(x);
  const Tensor xc = cl ? x : contiguous(x);
  const Tensor wc = contiguous_or_undefined(c.in("weight")), bc = contiguous_or_undefined(c.in("bias"));
  Tensor y = empty_in_layout(xc, cl);
  const auto s = x.sizes();
  const GroupNormDims d = group_norm_dims(s.data(), s.size(), num_groups, cl);
  if (d.S != 0) {
    const auto stream = static_cast<cudaStream_t>(current_cuda_stream(x));
    dispatch_float(dtype(x), kOp, [&](auto tag) {
      using T = decltype(tag);
      // From torch's caching allocator: freed back to it (for this stream) when `ws` dies, after
      // the kernels that use it were queued, which is what the allocator expects.
      const size_t ws_bytes = cuda::group_norm_workspace_bytes<T>(d);
      Tensor ws = ws_bytes > 0 ? empty({static_cast<int64_t>(ws_bytes)}, ScalarType::Byte, x) : undefined_tensor();
      const cudaError_t err =
          cuda::launch_group_norm<T>(stream, ptr<T>(xc), opt_ptr<T>(wc), opt_ptr<T>(bc), mutable_ptr<T>(y), d, eps,
                                     act, ws_bytes > 0 ? ws.data_ptr() : nullptr, ws_bytes);
      if (err != cudaSuccess) {
        throw_error(nullptr, kOp, std::string("CUDA launch failed: ") + cudaGetErrorName(err) + " (" +
                                      cudaGetErrorString(err) + ")");
      }
    });
  }
  c.set_output(0, std::move(y));
}

const char* opbridge_namespace() { return "opbridge"; }

}  // namespace

// The library's namespace spelled out (this file is also syntax-checked on its own, without
// opbridge_add_op's OPBRIDGE_TORCH_NAMESPACE).
STABLE_TORCH_LIBRARY_IMPL(opbridge, CUDA, m) { m.impl("group_norm", &declared_kernel<&group_norm_decl, &group_norm_cuda_impl, &opbridge_namespace>); }

}  // namespace opbridge::torch_adapter
