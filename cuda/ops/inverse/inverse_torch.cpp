// torch op opbridge::inverse on CUDA tensors, on the stable ABI: same schema, checks and messages
// as the CPU implementation (cpp/ops/inverse/inverse_torch.cpp), queued on torch's current stream.
//
// on_singular="raise" (default): a singular matrix raises torch.linalg.LinAlgError (through
// opbridge.ops), as on the CPU: the kernel's 8-byte report is copied to the host, which
// synchronizes the current stream once per call (as torch.linalg.inv's own error check does).
// on_singular="nan": a singular matrix's output is all NaN and the report is not read, so the call
// never synchronizes (it can be captured in a CUDA graph).
#include <torch/csrc/stable/accelerator.h>

#include <string>

#include "inverse.cuh"
#include "opbridge/inverse.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::inverse";

void inverse_cuda_impl(TorchCall& c) {
  const Tensor& x = c.in("x");
  const bool nan_on_singular = c.call().attr_string("on_singular") == "nan";
  const InverseDims d = inverse_dims(sizes(x));
  const int64_t n = d.n, batch = d.batch;
  const torch::stable::accelerator::DeviceGuard device_guard(x.get_device_index());
  const Tensor xc = contiguous(x);
  Tensor y = empty_like(xc);
  if (x.numel() == 0) {
    c.set_output(0, std::move(y));
    return;
  }
  const auto stream = static_cast<cudaStream_t>(current_cuda_stream(x));
  // The report word (int64 -1 == kInverseInfoOk) and the workspace, from torch's allocator.
  const Tensor info = empty({1}, ScalarType::Long, x);
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    const size_t ws_bytes = cuda::inverse_workspace_bytes<T>(batch, n);
    Tensor ws = ws_bytes > 0 ? empty({static_cast<int64_t>(ws_bytes)}, ScalarType::Byte, x) : undefined_tensor();
    return cuda::launch_inverse<T>(stream, ptr<T>(xc), mutable_ptr<T>(y), batch, n,
                                   static_cast<uint64_t*>(info.data_ptr()), ws_bytes > 0 ? ws.data_ptr() : nullptr,
                                   ws_bytes, nan_on_singular);
  };
  const cudaError_t err = dtype(x) == ScalarType::Float ? launch(float{}) : launch(double{});
  if (err != cudaSuccess) {
    throw_error(nullptr, kOp, std::string("CUDA launch failed: ") + cudaGetErrorName(err) + " (" +
                                  cudaGetErrorString(err) + ")");
  }
  if (!nan_on_singular) {
    const Tensor host = to_cpu(info);
    int64_t index = 0, step = 0;
    if (cuda::inverse_info_singular(static_cast<uint64_t>(*ptr<int64_t>(host)), &index, &step)) {
      // torch.linalg.LinAlgError, as on the CPU and as torch.linalg.inv raises.
      throw_error(kLinAlgErrorTag, kOp, cuda::inverse_singular_status(index, step).message());
    }
  }
  c.set_output(0, std::move(y));
}

const char* opbridge_namespace() { return "opbridge"; }

}  // namespace

// The library's namespace spelled out (this file is also syntax-checked on its own, without
// opbridge_add_op's OPBRIDGE_TORCH_NAMESPACE).
STABLE_TORCH_LIBRARY_IMPL(opbridge, CUDA, m) { m.impl("inverse", &declared_kernel<&inverse_decl, &inverse_cuda_impl, &opbridge_namespace>); }

}  // namespace opbridge::torch_adapter
