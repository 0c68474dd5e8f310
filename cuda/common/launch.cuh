// opbridge CUDA helpers shared by the kernel files (ops/<op>/<op>_kernel.cu); nvcc only.
//
// Every kernel launch goes through opbridge::cuda::launch(), which takes a Stream. A Stream can
// only be built explicitly from a cudaStream_t value the caller was handed (ORT's compute stream,
// torch's current stream); building one from a literal 0, NULL or nullptr does not compile. So
// no kernel can be queued on the default stream by accident, where it would run unordered with
// the framework's work. cuda/check_streams.py additionally rejects `<<<...>>>` launches without a
// stream argument, direct cudaLaunchKernel* calls and synchronous default-stream API calls anywhere
// under cuda/ (run by the build and by the test suite).
//
// We deliberately do NOT compile with `--default-stream per-thread`: torch's current stream is
// the legacy default stream (a null cudaStream_t) unless the user picked another one, and under
// per-thread semantics that null handle would name a different (per-thread) stream, silently
// breaking ordering with torch's own kernels. A null handle that came from the framework is
// passed through unchanged and means what the framework meant by it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "common/device.h"
#include "opbridge/status.h"

// Shared memory is declared through these macros, so that the host emulation of the runtime
// (tests/cuda_ops/cuda_host/sim/simt.h, which defines its own forms) can give every block and declaration
// a buffer of its own, of exactly the declared size.
//   OPBRIDGE_SHARED_ARRAY(T, name, count)  __shared__ T name[count]
//   OPBRIDGE_SHARED_VAR(T, name)           __shared__ T name
//   OPBRIDGE_DYNAMIC_SHARED(T, name)       the launch's dynamic shared memory, 16-byte aligned
#ifndef OPBRIDGE_SIMT_HOST
#define OPBRIDGE_SHARED_ARRAY(T, name, count) __shared__ T name[count]
#define OPBRIDGE_SHARED_VAR(T, name) __shared__ T name
#define OPBRIDGE_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif

namespace opbridge::cuda {

// A stream chosen by the caller. See the file comment.
class Stream {
 public:
  explicit Stream(cudaStream_t s) noexcept : s_(s) {}
  // A literal 0 / 0L / nullptr would be the default stream: refuse at compile time.
  Stream(std::nullptr_t) = delete;
  Stream(int) = delete;
  Stream(long) = delete;
  Stream(long long) = delete;
  Stream(unsigned) = delete;
  Stream(unsigned long) = delete;
  cudaStream_t get() const noexcept { return s_; }

 private:
  cudaStream_t s_;
};

// Grid, block, dynamic shared memory and (sm_90+) thread-block-cluster size of one launch.
struct LaunchShape {
  dim3 grid;
  dim3 block;
  size_t smem_bytes = 0;
  unsigned cluster = 1;  // blocks per cluster along x; 1 = no cluster
};

// Launches kernel<<<shape, stream>>>(args...) through cudaLaunchKernelEx (which also carries the
// cluster attribute). Returns the launch error; never synchronizes.
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), const LaunchShape& shape, Stream stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = shape.grid;
  cfg.blockDim = shape.block;
  cfg.dynamicSmemBytes = shape.smem_bytes;
  cfg.stream = stream.get();
  cudaLaunchAttribute attr[1] = {};
  cfg.attrs = attr;
  cfg.numAttrs = 0;
  if (shape.cluster > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = shape.cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// The Status a compute function returns for a CUDA call that failed (`what` says which):
// "CUDA launch failed: cudaErrorInvalidValue (invalid argument)".
inline Status cuda_status(cudaError_t err, const char* what = "CUDA launch") {
  if (err == cudaSuccess) return Status::Ok();
  return Status::RuntimeError(std::string(what) + " failed: " + cudaGetErrorName(err) + " (" +
                              cudaGetErrorString(err) + ")");
}

// Largest grid.x of any launch (the CUDA limit is 2^31 - 1; launchers use grid-stride loops and
// stay far below it).
inline constexpr int64_t kMaxGridX = 2147483647;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
inline int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// n / d for 0 <= n < 2^31 and 1 <= d < 2^31 with a multiply-high and a shift instead of a
// division (integer division costs ~20 instructions, too many per element in a memory-bound
// kernel). Granlund-Montgomery: with s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1,
// n / d = (umulhi(n, m) + n) >> s; the sum fits in 32 bits because n < 2^31.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    s = 0;
    while ((uint64_t{1} << s) < divisor) ++s;
    m = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - divisor)) / divisor + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (__umulhi(n, m) + n) >> s; }
};

}  // namespace opbridge::cuda
