// LogCumSumExp CUDA kernel: one thread per scanned line. Lines are independent and usually
// many (batch x features); a line's own scan is sequential, like the CPU kernel's. Queued on the
// framework's stream (torch's current one, ORT's compute stream).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "log_cumsum_exp.h"

namespace userops {
namespace {

// 256 threads: a multiple of the warp size that keeps several blocks resident per SM.
constexpr int kThreads = 256;
// Grid-stride loop beyond this many blocks: enough to fill any current GPU.
constexpr int64_t kMaxBlocks = 65535;

template <class T>
__global__ void log_cumsum_exp_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t lines, int64_t len,
                                      int64_t inner) {
  for (int64_t l = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; l < lines;
       l += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = l / inner, k = l % inner;
    const T* xl = x + o * len * inner + k;
    T* yl = y + o * len * inner + k;
    T m = -INFINITY, s = 0;
    for (int64_t i = 0; i < len; ++i) {
      const T v = xl[i * inner];
      if (v > m) {
        s = s * exp(m - v) + T(1);
        m = v;
      } else if (v == m) {
        s += T(1);
      } else {
        s += exp(v - m);
      }
      yl[i * inner] = m + log(s);
    }
  }
}

opbridge::Status compute(const opbridge::KernelCall& k) {
  const ScanDims d = log_cumsum_exp_dims(k);  // shapes on the host, data on the device
  const int64_t lines = d.outer * d.inner;
  if (lines == 0 || d.len == 0) return opbridge::Status::Ok();
  const int64_t blocks = (lines + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
  const auto stream = static_cast<cudaStream_t>(k.stream());
  return opbridge::dispatch<float, double>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    log_cumsum_exp_kernel<T><<<grid, kThreads, 0, stream>>>(k.in<T>("x"), k.out<T>(0), lines, d.len, d.inner);
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? opbridge::Status::Ok()
                              : opbridge::Status::RuntimeError(std::string("CUDA error: ") + cudaGetErrorString(err));
  });
}

}  // namespace

OPBRIDGE_KERNEL(log_cumsum_exp_decl, kCuda, compute);

}  // namespace userops
