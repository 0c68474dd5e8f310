// LogCumSumExp CUDA kernel: one thread per scanned line. Lines are independent and usually
// many (batch x features); a line's own scan is sequential, like the CPU kernel's.
#include <cmath>
#include <cstdint>

#include "log_cumsum_exp.cuh"

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

}  // namespace

template <class T>
cudaError_t launch_log_cumsum_exp(cudaStream_t stream, const T* x, T* y, const ScanDims& d) {
  const int64_t lines = d.outer * d.inner;
  if (lines == 0 || d.len == 0) return cudaSuccess;
  const int64_t blocks = (lines + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
  log_cumsum_exp_kernel<T><<<grid, kThreads, 0, stream>>>(x, y, lines, d.len, d.inner);
  return cudaGetLastError();
}

template cudaError_t launch_log_cumsum_exp<float>(cudaStream_t, const float*, float*, const ScanDims&);
template cudaError_t launch_log_cumsum_exp<double>(cudaStream_t, const double*, double*, const ScanDims&);

}  // namespace userops
