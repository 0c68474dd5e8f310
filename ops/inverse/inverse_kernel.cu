// Inverse CUDA kernels and their launcher (see inverse.cuh).
//
// The arithmetic is the CPU kernel's (inverse_cpu.cpp): in-place Gauss-Jordan with partial
// pivoting. Pivot step k, pivot row p (largest |U[i,k]| for i >= k, the first on ties, NaN
// above everything), pivot a:
//   row p takes row k's old contents (the interchange);
//   every row i != k:  l_i = r_i[k] / a (a true quotient, as in LAPACK's unblocked LU, so a
//                      row equal to the pivot row is eliminated to exact zeros);
//                      r_i[j] -= l_i * q[j] (j != k), r_i[k] = -l_i, where q = old row p;
//   row k:             q[j] * (1/a) (j != k), and 1/a at column k.
// The interchanges become column interchanges of the result, undone when storing. A pivot that
// is exactly zero marks the matrix singular; the first such matrix of the batch is reported
// through one atomicMin on a packed (index, step) word.
//
// Paths:
//   n == 2, float  one thread per matrix, adjugate / determinant in double, as on the CPU
//                  (products of floats are exact in double: det == 0 exactly when singular).
//   n <= 32        W = next_pow2(n) lanes per matrix, lane i holding row i in registers; the
//                  pivot search is a W-lane argmax and the pivot row reaches every lane by
//                  shuffles. 32 / W matrices per warp, so small matrices share warps.
//   n <= 64        one block per matrix, the matrix in shared memory.
//   larger         one block per matrix, in place in `out` (L2-resident for moderate n); the
//                  pivot-row vectors live in the workspace. Correct for every n, but one SM
//                  per matrix: large single matrices are far from a vendor LU's speed.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/launch.cuh"
#include "inverse.cuh"
#include "inverse.h"

namespace opbridge::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
// Largest n of the register path (one warp holds a 32 x 32 matrix, one row per lane).
constexpr int kMaxRegisterN = 32;
// Largest n of the shared-memory path: 64 x 65 doubles plus the vectors stay below the 48 KiB
// of static shared memory every architecture grants without opt-in.
constexpr int kMaxSharedN = 64;
// Block sizes: 128 threads (4 warps) per block for the register path keeps many matrices in
// flight per SM; 256 for the shared-memory path (4 rows of 64 per pass); 512 for the global one.
constexpr int kSmallBlock = 128;
constexpr int kSharedBlock = 256;
constexpr int kGlobalBlock = 512;
// Grid-stride loops launch at most this many blocks per SM.
constexpr int64_t kMaxBlocksPerSm = 32;
// The global path runs at most this many blocks, each with its own workspace slot, so the
// workspace size does not depend on the device.
constexpr int64_t kMaxGlobalBlocks = 1024;

// |v| as an integer that orders like |v| and puts NaN above +inf (IEEE magnitudes compare like
// their bit patterns), always >= 0; -1 marks rows that do not take part in a pivot search. The
// sign bit is cleared with an integer mask, not with fabs: PTX's abs returns "an unspecified NaN"
// for a NaN, and GPUs give one with the sign bit set, whose double key was negative. A column of
// NaNs (what a zero pivot leaves behind) then had no row above -1, the pivot row came out as n,
// and the column-order step read piv past its end (an out-of-bounds shared-memory read).
__device__ __forceinline__ long long magnitude_key(float v) {
  return static_cast<long long>(__float_as_uint(v) & 0x7fffffffu);
}
__device__ __forceinline__ long long magnitude_key(double v) {
  return __double_as_longlong(v) & 0x7fffffffffffffffLL;
}

// a wins over b: larger key, the smaller row on ties (the first maximum, as LAPACK's i?amax).
__device__ __forceinline__ bool better(long long key_a, int row_a, long long key_b, int row_b) {
  return key_a > key_b || (key_a == key_b && row_a < row_b);
}

template <class T> __device__ __forceinline__ T quiet_nan();
template <> __device__ __forceinline__ float quiet_nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double quiet_nan<double>() { return __longlong_as_double(0x7ff8000000000000LL); }

__device__ __forceinline__ void report_singular(uint64_t* info, int64_t index, int step) {
  const unsigned long long key =
      (static_cast<unsigned long long>(index) << kInverseInfoStepBits) | static_cast<unsigned long long>(step);
  atomicMin(reinterpret_cast<unsigned long long*>(info), key);
}

// ---- n == 2, float -------------------------------------------------------------------------

// a, out: [batch, 2, 2] (may alias: each thread reads its matrix before writing it).
__global__ void __launch_bounds__(kSmallBlock)
    inverse_2x2_f32_kernel(const float* a, float* out, int64_t batch, uint64_t* info, bool nan_on_singular) {
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < batch;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double a00 = a[4 * b], a01 = a[4 * b + 1], a10 = a[4 * b + 2], a11 = a[4 * b + 3];
    const double det = a00 * a11 - a01 * a10;
    if (det == 0.0) {
      // The step at which elimination with partial pivoting meets the zero pivot.
      report_singular(info, b, (a00 == 0.0 && a10 == 0.0) ? 0 : 1);
      if (nan_on_singular) {
        const float nan = __int_as_float(0x7fc00000);
        out[4 * b] = nan;
        out[4 * b + 1] = nan;
        out[4 * b + 2] = nan;
        out[4 * b + 3] = nan;
      }
      continue;
    }
    const double r = 1.0 / det;
    out[4 * b] = static_cast<float>(a11 * r);
    out[4 * b + 1] = static_cast<float>(-a01 * r);
    out[4 * b + 2] = static_cast<float>(-a10 * r);
    out[4 * b + 3] = static_cast<float>(a00 * r);
  }
}

// ---- n <= 32: rows in registers ------------------------------------------------------------

// W lanes (a power of two >= n) per matrix; lane i holds row i (zeros past column n - 1, and
// lanes i >= n hold zero rows that never take part in a pivot search).
//   a, out: [batch, n, n] (may alias: a matrix is read completely before it is written)
template <class T, int W>
__global__ void __launch_bounds__(kSmallBlock)
    inverse_small_kernel(const T* a, T* out, int64_t batch, int n, uint64_t* info, bool nan_on_singular) {
  const int lane = static_cast<int>(threadIdx.x) % W;
  const int64_t slot = threadIdx.x / W;
  const int64_t per_block = blockDim.x / W;
  // The lanes of this matrix within the warp, for ballots.
  const int sub_shift = (static_cast<int>(threadIdx.x) & 31) / W * W;
  const unsigned sub_mask = W == 32 ? kFullMask : ((1u << W) - 1u);
  const int64_t nn = static_cast<int64_t>(n) * n;

  // Uniform over the block: every lane runs every iteration and every shuffle.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * per_block; base < batch;
       base += static_cast<int64_t>(gridDim.x) * per_block) {
    const int64_t b = base + slot;
    const bool active = b < batch;
    const bool row_ok = active && lane < n;
    T r[W];
    {
      const T* src = a + (active ? b : 0) * nn + static_cast<int64_t>(row_ok ? lane : 0) * n;
#pragma unroll
      for (int j = 0; j < W; ++j) r[j] = (row_ok && j < n) ? src[j] : T(0);
    }
    int failed = -1;  // the first step with a zero pivot (the same in every lane)
    int my_piv = lane;  // lane k keeps the pivot row of step k

    // The step loop is not unrolled (an unrolled 32 x 32 body takes ptxas minutes per
    // architecture); registers are only ever indexed by the unrolled column loop, and column k
    // is picked out with selects, so the row stays in registers.
#pragma unroll 1
    for (int k = 0; k < n; ++k) {  // n is the same for every matrix: uniform
      T rk = T(0);  // this lane's column k
#pragma unroll
      for (int j = 0; j < W; ++j) rk = j == k ? r[j] : rk;
      // Pivot search over rows k..n-1 of column k.
      long long key = (lane >= k && lane < n) ? magnitude_key(rk) : -1;
      int row = lane;
#pragma unroll
      for (int off = W / 2; off > 0; off /= 2) {
        const long long other_key = __shfl_xor_sync(kFullMask, key, off, W);
        const int other_row = __shfl_xor_sync(kFullMask, row, off, W);
        if (better(other_key, other_row, key, row)) {
          key = other_key;
          row = other_row;
        }
      }
      const int p = row;
      const T pivot = __shfl_sync(kFullMask, rk, p, W);
      const T old_kk = __shfl_sync(kFullMask, rk, k, W);
      if (failed < 0 && pivot == T(0)) failed = k;
      if (lane == k) my_piv = p;
      // This lane's row after the interchange (row p takes old row k), column k.
      const T l = (lane == p ? old_kk : rk) / pivot;
      const T d = T(1) / pivot;
      const T col_k = lane == k ? d : -l;  // the new column k
      // Column by column: the shuffles of column j read lanes p and k before any lane writes
      // column j, and no other column is touched meanwhile.
#pragma unroll
      for (int j = 0; j < W; ++j) {
        const T qj = __shfl_sync(kFullMask, r[j], p, W);
        const T kj = __shfl_sync(kFullMask, r[j], k, W);
        const T rij = lane == p ? kj : r[j];
        const T v = lane == k ? qj * d : rij - l * qj;
        r[j] = j == k ? col_k : v;
      }
    }

    // Undo the interchanges: the column order c (lane j holds c[j]) is the identity with
    // columns k and piv[k] swapped, last step first.
    int c = lane;
    for (int k = n - 1; k >= 0; --k) {
      const int pk = __shfl_sync(kFullMask, my_piv, k, W);
      const int ck = __shfl_sync(kFullMask, c, k, W);
      const int cp = __shfl_sync(kFullMask, c, pk, W);
      if (lane == k) c = cp;
      if (lane == pk) c = ck;
    }
    // out[i][j] = m[i][c[j]]: register s goes to the column j with c[j] == s. A singular
    // matrix (failed is the same in all its lanes) gets NaN instead when asked for.
    const bool poison = nan_on_singular && failed >= 0;
    T* dst = out + (active ? b : 0) * nn + static_cast<int64_t>(row_ok ? lane : 0) * n;
#pragma unroll
    for (int s = 0; s < W; ++s) {
      const unsigned ballot = (__ballot_sync(kFullMask, c == s) >> sub_shift) & sub_mask;
      if (row_ok && s < n) dst[__ffs(static_cast<int>(ballot)) - 1] = poison ? quiet_nan<T>() : r[s];
    }
    if (active && lane == 0 && failed >= 0) report_singular(info, b, failed);
  }
}

// ---- larger n: one block per matrix --------------------------------------------------------

// Block-wide argmax over rows [k, n) of column k of m (row stride ld); the result is returned
// to every thread. red_key/red_row: 32 entries of shared memory each.
template <class T>
__device__ int block_pivot_row(const T* m, int64_t ld, int k, int n, long long* red_key, int* red_row) {
  long long key = -1;
  int row = n;
  for (int i = k + static_cast<int>(threadIdx.x); i < n; i += blockDim.x) {
    const long long v = magnitude_key(m[i * ld + k]);
    if (better(v, i, key, row)) {
      key = v;
      row = i;
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const long long other_key = __shfl_xor_sync(kFullMask, key, off);
    const int other_row = __shfl_xor_sync(kFullMask, row, off);
    if (better(other_key, other_row, key, row)) {
      key = other_key;
      row = other_row;
    }
  }
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  if (lane == 0) {
    red_key[warp] = key;
    red_row[warp] = row;
  }
  __syncthreads();
  key = -1;
  row = n;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
    if (better(red_key[w], red_row[w], key, row)) {
      key = red_key[w];
      row = red_row[w];
    }
  }
  __syncthreads();  // red_* may be overwritten by the next call
  return row;
}

// One matrix per block (grid-stride over the batch).
//   IN_SHARED: the matrix is copied to shared memory (row stride n + 1, so that a column is
//              spread over the banks), else it is inverted in place in `out` (row stride n).
//   tpr:       threads per row in the update loops (a power of two <= blockDim.x)
//   ws, ws_stride: global path: the workspace; block x uses bytes [x * ws_stride, ...)
//   a, out: [batch, n, n]; may alias (a matrix is read before it is written)
template <class T, bool IN_SHARED>
__global__ void __launch_bounds__(IN_SHARED ? kSharedBlock : kGlobalBlock, 1)
    inverse_block_kernel(const T* a, T* out, int64_t batch, int n, int tpr, unsigned char* ws, int64_t ws_stride,
                         uint64_t* info, bool nan_on_singular) {
  OPBRIDGE_SHARED_ARRAY(long long, red_key, 32);
  OPBRIDGE_SHARED_ARRAY(int, red_row, 32);
  OPBRIDGE_SHARED_VAR(int, failed);
  const int64_t nn = static_cast<int64_t>(n) * n;
  const int64_t ld = IN_SHARED ? n + 1 : n;
  // Vectors: q = pivot row (q[k] = 1), rk = old row k, l = multipliers; piv and col: ints.
  T* m_shared = nullptr;
  unsigned char* vec_base;
  if constexpr (IN_SHARED) {
    OPBRIDGE_DYNAMIC_SHARED(unsigned char, smem);
    m_shared = reinterpret_cast<T*>(smem);
    vec_base = smem + ((ld * n * sizeof(T) + 15) / 16) * 16;
  } else {
    vec_base = ws + blockIdx.x * ws_stride;
  }
  T* q = reinterpret_cast<T*>(vec_base);
  T* rk = q + n;
  T* l = rk + n;
  int* piv = reinterpret_cast<int*>(l + n);
  int* col = piv + n;

  const int tid = static_cast<int>(threadIdx.x);
  const int r0 = tid / tpr, c0 = tid % tpr;
  const int rows_per_pass = static_cast<int>(blockDim.x) / tpr;

  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const T* src = a + b * nn;
    T* m = IN_SHARED ? m_shared : out + b * nn;
    if (IN_SHARED || src != m) {
      for (int i = r0; i < n; i += rows_per_pass) {
        for (int j = c0; j < n; j += tpr) m[i * ld + j] = src[static_cast<int64_t>(i) * n + j];
      }
    }
    if (tid == 0) failed = -1;
    __syncthreads();

    for (int k = 0; k < n; ++k) {
      const int p = block_pivot_row(m, ld, k, n, red_key, red_row);
      const T pivot = m[p * ld + k];
      const T old_kk = m[static_cast<int64_t>(k) * ld + k];
      if (tid == 0) {
        piv[k] = p;
        if (failed < 0 && pivot == T(0)) failed = k;
      }
      for (int j = tid; j < n; j += blockDim.x) {
        q[j] = j == k ? T(1) : m[p * ld + j];
        rk[j] = m[static_cast<int64_t>(k) * ld + j];
      }
      for (int i = tid; i < n; i += blockDim.x) l[i] = (i == p ? old_kk : m[i * ld + k]) / pivot;
      __syncthreads();
      const T d = T(1) / pivot;
      for (int i = r0; i < n; i += rows_per_pass) {
        const T li = l[i];
        T* mi = m + i * ld;
        for (int j = c0; j < n; j += tpr) {
          T v;
          if (i == k) {
            v = j == k ? d : q[j] * d;
          } else if (j == k) {
            v = -li;
          } else {
            v = (i == p ? rk[j] : mi[j]) - li * q[j];
          }
          mi[j] = v;
        }
      }
      __syncthreads();
    }

    // Column order: the identity with columns k and piv[k] swapped, last step first.
    if (tid == 0) {
      for (int j = 0; j < n; ++j) col[j] = j;
      for (int k = n - 1; k >= 0; --k) {
        const int t = col[k];
        col[k] = col[piv[k]];
        col[piv[k]] = t;
      }
      if (failed >= 0) report_singular(info, b, failed);
    }
    __syncthreads();
    if (nan_on_singular && failed >= 0) {
      // `failed` is read by every thread after the barrier above and written again only after
      // the next matrix's first barrier.
      T* dst = out + b * nn;
      for (int64_t i = tid; i < nn; i += blockDim.x) dst[i] = quiet_nan<T>();
    } else if constexpr (IN_SHARED) {
      T* dst = out + b * nn;
      for (int i = r0; i < n; i += rows_per_pass) {
        for (int j = c0; j < n; j += tpr) dst[static_cast<int64_t>(i) * n + j] = m[i * ld + col[j]];
      }
    } else {
      // In place, one row at a time through q.
      for (int i = 0; i < n; ++i) {
        T* mi = m + static_cast<int64_t>(i) * ld;
        for (int j = tid; j < n; j += blockDim.x) q[j] = mi[col[j]];
        __syncthreads();
        for (int j = tid; j < n; j += blockDim.x) mi[j] = q[j];
        __syncthreads();
      }
    }
    __syncthreads();  // shared memory and vectors are reused by the next matrix
  }
}

// ---- host side -----------------------------------------------------------------------------

// Bytes of the vectors of the block kernels (q, rk, l: n elements of T; piv, col: n ints).
template <class T>
int64_t vector_bytes(int64_t n) {
  return round_up(3 * n * static_cast<int64_t>(sizeof(T)) + 2 * n * static_cast<int64_t>(sizeof(int)), 16);
}

template <class T>
cudaError_t launch_small(Stream stream, const DeviceInfo& dev, const T* a, T* out, int64_t batch, int n,
                         uint64_t* info, bool nan_on_singular) {
  const int w = next_pow2(n);
  const int64_t per_block = kSmallBlock / w;
  const int64_t blocks = std::min(ceil_div(batch, per_block), dev.sm_count * kMaxBlocksPerSm);
  const LaunchShape shape{dim3(static_cast<unsigned>(blocks)), dim3(kSmallBlock), 0, 1};
  switch (w) {
    case 1: return launch(inverse_small_kernel<T, 1>, shape, stream, a, out, batch, n, info, nan_on_singular);
    case 2:
      // float n == 2 takes the adjugate kernel (launch_inverse): no register kernel for it.
      if constexpr (std::is_same_v<T, float>) {
        return cudaErrorInvalidValue;
      } else {
        return launch(inverse_small_kernel<T, 2>, shape, stream, a, out, batch, n, info, nan_on_singular);
      }
    case 4: return launch(inverse_small_kernel<T, 4>, shape, stream, a, out, batch, n, info, nan_on_singular);
    case 8: return launch(inverse_small_kernel<T, 8>, shape, stream, a, out, batch, n, info, nan_on_singular);
    case 16: return launch(inverse_small_kernel<T, 16>, shape, stream, a, out, batch, n, info, nan_on_singular);
    default: return launch(inverse_small_kernel<T, 32>, shape, stream, a, out, batch, n, info, nan_on_singular);
  }
}

template <class T>
int64_t global_blocks(int64_t batch) {
  return std::min(batch, kMaxGlobalBlocks);
}

}  // namespace

template <class T>
size_t inverse_workspace_bytes(int64_t batch, int64_t n) {
  if (batch <= 0 || n <= kMaxSharedN) return 0;
  return static_cast<size_t>(global_blocks<T>(batch) * vector_bytes<T>(n));
}

template <class T>
cudaError_t launch_inverse(cudaStream_t stream_handle, const T* a, T* out, int64_t batch, int64_t n, uint64_t* info,
                           void* workspace, size_t workspace_bytes, bool nan_on_singular) {
  if (batch < 0 || n < 0 || n >= (int64_t{1} << kInverseInfoStepBits) ||
      batch >= (int64_t{1} << (63 - kInverseInfoStepBits)) || info == nullptr) {
    return cudaErrorInvalidValue;
  }
  const Stream stream{stream_handle};
  // Reset the report first, on the stream, so that it describes this call only.
  cudaError_t e = cudaMemsetAsync(info, 0xff, sizeof(uint64_t), stream.get());
  if (e != cudaSuccess || batch == 0 || n == 0) return e;
  DeviceInfo dev;
  e = current_device_info(&dev);
  if (e != cudaSuccess) return e;
  const int ni = static_cast<int>(n);

  if constexpr (std::is_same_v<T, float>) {
    if (n == 2) {
      const int64_t blocks = std::min(ceil_div(batch, kSmallBlock), dev.sm_count * kMaxBlocksPerSm);
      const LaunchShape shape{dim3(static_cast<unsigned>(blocks)), dim3(kSmallBlock), 0, 1};
      return launch(inverse_2x2_f32_kernel, shape, stream, a, out, batch, info, nan_on_singular);
    }
  }
  if (n <= kMaxRegisterN) return launch_small<T>(stream, dev, a, out, batch, ni, info, nan_on_singular);

  const int tpr_shared = std::min(kSharedBlock, next_pow2(n));
  if (n <= kMaxSharedN) {
    const size_t smem = static_cast<size_t>(round_up((n + 1) * n * static_cast<int64_t>(sizeof(T)), 16) +
                                            vector_bytes<T>(n));
    const int64_t blocks = std::min(batch, dev.sm_count * kMaxBlocksPerSm);
    const LaunchShape shape{dim3(static_cast<unsigned>(blocks)), dim3(kSharedBlock), smem, 1};
    return launch(inverse_block_kernel<T, true>, shape, stream, a, out, batch, ni, tpr_shared,
                  static_cast<unsigned char*>(nullptr), int64_t{0}, info, nan_on_singular);
  }
  const int64_t blocks = global_blocks<T>(batch);
  if (workspace == nullptr || workspace_bytes < static_cast<size_t>(blocks * vector_bytes<T>(n)) ||
      reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int tpr = std::min(kGlobalBlock, next_pow2(n));
  const LaunchShape shape{dim3(static_cast<unsigned>(blocks)), dim3(kGlobalBlock), 0, 1};
  return launch(inverse_block_kernel<T, false>, shape, stream, a, out, batch, ni, tpr,
                static_cast<unsigned char*>(workspace), vector_bytes<T>(n), info, nan_on_singular);
}

template size_t inverse_workspace_bytes<float>(int64_t, int64_t);
template size_t inverse_workspace_bytes<double>(int64_t, int64_t);
template cudaError_t launch_inverse<float>(cudaStream_t, const float*, float*, int64_t, int64_t, uint64_t*, void*,
                                           size_t, bool);
template cudaError_t launch_inverse<double>(cudaStream_t, const double*, double*, int64_t, int64_t, uint64_t*,
                                            void*, size_t, bool);

// ---- the compute function (opbridge/kernel.h) --------------------------------------------------
// on_singular="raise" (default): a singular matrix is an error, as on the CPU: the kernel's 8-byte
// report is read back after the launch, which synchronizes the framework's stream once per call
// (torch.linalg.inv synchronizes for its error check the same way). "nan": a singular matrix's
// output is all NaN, nothing is read back and nothing synchronizes (the call can be captured in a
// CUDA graph).

namespace {

Status compute(const KernelCall& k) {
  const InverseParams p = inverse_params(k);
  if (p.d.batch == 0) return Status::Ok();
  const auto stream = static_cast<cudaStream_t>(k.stream());
  return dispatch<float, double>(k.type("x"), [&](auto tag) -> Status {
    using T = decltype(tag);
    // One scratch block: the report, then the workspace (16 bytes keep the workspace aligned).
    constexpr size_t kInfoBytes = 16;
    const size_t ws_bytes = inverse_workspace_bytes<T>(p.d.batch, p.d.n);
    auto* block = static_cast<unsigned char*>(k.scratch(kInfoBytes + ws_bytes));
    auto* info = reinterpret_cast<uint64_t*>(block);
    OPBRIDGE_RETURN_IF_ERROR(cuda_status(launch_inverse<T>(stream, k.in<T>("x"), k.out<T>(0), p.d.batch, p.d.n, info,
                                                           ws_bytes > 0 ? block + kInfoBytes : nullptr, ws_bytes,
                                                           p.nan_on_singular)));
    if (p.nan_on_singular) return Status::Ok();
    uint64_t report = kInverseInfoOk;
    OPBRIDGE_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(&report, info, sizeof report, cudaMemcpyDeviceToHost, stream),
                                         "reading the singular-matrix report"));
    OPBRIDGE_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "synchronizing the stream"));
    int64_t index = 0, step = 0;
    if (inverse_info_singular(report, &index, &step)) return inverse_singular_status(index, step);
    return Status::Ok();
  });
}

}  // namespace

}  // namespace opbridge::cuda

OPBRIDGE_KERNEL(opbridge::inverse_decl, kCuda, opbridge::cuda::compute);
