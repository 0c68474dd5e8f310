// torch op opbridge::inverse on CUDA tensors: same schema, checks and messages as the CPU
// implementation (cpp/ops/inverse/inverse_torch.cpp), queued on torch's current stream.
//
// on_singular="raise" (default): a singular matrix raises torch.linalg.LinAlgError, as on the CPU:
// the kernel's 8-byte report is read back with .item(), which synchronizes the current stream
// once per call (as torch.linalg.inv's own error check does).
// on_singular="nan": a singular matrix's output is all NaN and the report is not read, so the call
// never synchronizes (it can be captured in a CUDA graph).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "inverse.cuh"
#include "opbridge/inverse.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::inverse";

at::Tensor inverse_cuda_impl(const at::Tensor& x, c10::string_view on_singular) {
  check_call(inverse_decl(), kOp, {x, on_singular});
  const bool nan_on_singular = on_singular == "nan";
  const auto dt = x.scalar_type();
  const InverseDims d = inverse_dims({x.sizes().begin(), x.sizes().end()});
  const int64_t n = d.n, batch = d.batch;

  const c10::cuda::CUDAGuard device_guard(x.device());
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  if (y.numel() == 0) return y;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  // The report word (int64 -1 == kInverseInfoOk) and the workspace, from torch's allocator.
  at::Tensor info = at::empty({1}, x.options().dtype(at::kLong));
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    const size_t ws_bytes = cuda::inverse_workspace_bytes<T>(batch, n);
    at::Tensor ws;
    if (ws_bytes > 0) ws = at::empty({static_cast<int64_t>(ws_bytes)}, x.options().dtype(at::kByte));
    return cuda::launch_inverse<T>(stream, ptr<T>(xc), mutable_ptr<T>(y), batch, n,
                                   static_cast<uint64_t*>(info.mutable_data_ptr()),
                                   ws_bytes > 0 ? ws.mutable_data_ptr() : nullptr, ws_bytes, nan_on_singular);
  };
  const cudaError_t err = dt == at::kFloat ? launch(float{}) : launch(double{});
  TORCH_CHECK(err == cudaSuccess, kOp, ": CUDA launch failed: ", cudaGetErrorName(err), " (",
              cudaGetErrorString(err), ")");
  if (nan_on_singular) return y;
  int64_t index = 0, step = 0;
  if (cuda::inverse_info_singular(static_cast<uint64_t>(info.item<int64_t>()), &index, &step)) {
    // torch.linalg.LinAlgError, as on the CPU and as torch.linalg.inv raises.
    TORCH_CHECK_LINALG(false, kOp, ": ", cuda::inverse_singular_status(index, step).message());
  }
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(opbridge, CUDA, m) {
  m.impl("inverse", &inverse_cuda_impl);
}

}  // namespace opbridge::torch_adapter
