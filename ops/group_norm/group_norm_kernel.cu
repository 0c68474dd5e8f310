// GroupNorm CUDA kernels and their launcher (see group_norm.cuh).
//
// GroupNorm is memory bound: the floor is one read of x and one write of y (a copy). Each group
// (n, g) is M = (C / G) * S contiguous elements. Three paths, chosen per call from M, the number
// of groups N * G and the device:
//
//  fused    M <= 8192: a group is held in registers by tpg threads (a power of two: a few lanes
//           for tiny groups, so many groups share one block, up to a 512-thread block). Mean and
//           variance are taken exactly in two passes over the registers (no E[x^2] - E[x]^2
//           cancellation), then y is written: one read and one write of memory.
//  cluster  sm_90+, M <= 65536, or smaller M with too few groups to fill the GPU: a group is
//           split over a thread-block cluster of K <= 8 blocks, each holding its slice in
//           registers; the per-block sums are combined through distributed shared memory.
//           Still one read and one write.
//  split    anything else (larger groups, or sm_80 with M > 8192): three kernels. Per chunk
//           moments (count, mean, M2; Chan et al. merging, so no cancellation either), merged
//           per group in double, then a normalize pass that reads x again (from L2 when x fits
//           there: 50 MiB on H100) and writes y. Needs a small workspace.
//
// Statistics are accumulated in float for float/half/bfloat16 and in double for double.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdint>

#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "group_norm.cuh"
#include "group_norm_nhwc.cuh"

namespace opbridge::cuda {
namespace {

namespace cg = cooperative_groups;

// 1 / sqrt(var + eps) computed in double, as the CPU kernels do, stored in A. Where it is finite
// but beyond A's range (a group of equal values, var = 0, with an eps that float cannot hold,
// such as 1e-300) A's largest finite value stands in, so that (x - mean) * rstd is 0 there, as in
// double, not 0 * inf = NaN; an infinite one (var + eps == 0) and NaN stay what they are.
template <class A>
__device__ __forceinline__ A rstd_of(double var, double eps) {
  const double r = 1.0 / sqrt(var + eps);
  constexpr double kMax = sizeof(A) == sizeof(float) ? static_cast<double>(FLT_MAX) : DBL_MAX;
  return r > kMax && r <= DBL_MAX ? static_cast<A>(kMax) : static_cast<A>(r);
}

// ---- element types and the activation --------------------------------------------------------

// y = act(v): the activation fused into every store of y (see Activation in group_norm.h).
// SiLU as torch computes it, v / (1 + exp(-v)), in the accumulation type. The float division is
// __fdividef (2 ulp; 0 when 1 + exp(-v) overflows, the limit): an IEEE division's slow path is a
// call, which would make these register-resident kernels spill.
__device__ __forceinline__ float activate(float v, Activation act) {
  return act == Activation::kSilu ? __fdividef(v, 1.0f + expf(-v)) : v;
}
__device__ __forceinline__ double activate(double v, Activation act) {
  return act == Activation::kSilu ? v / (1.0 + exp(-v)) : v;
}

// ---- tuning constants ----------------------------------------------------------------------

// Elements each thread holds in registers in the fused/cluster kernels, and per round in the
// split kernels. 16 floats (32 registers for double) leave room within the 128 registers per
// thread that a 512-thread block may use, so nothing spills.
constexpr int kItems = 16;
// Largest block of the fused/cluster kernels: 512 threads x 16 elements = 8192 elements.
constexpr int kMaxBlock = 512;
constexpr int64_t kFusedMax = int64_t{kMaxBlock} * kItems;
// Portable cluster size limit (8 blocks on every sm_90+ part; larger needs opt-in).
constexpr int kMaxCluster = 8;
constexpr int64_t kClusterMax = kFusedMax * kMaxCluster;
// Blocks of a cluster each get at least this many elements, so splitting a small group for
// parallelism does not leave blocks with a handful of elements each.
constexpr int64_t kMinSlice = 1024;
// Threads (per SM) below which the fused path is considered to leave the GPU underused and a
// cluster split is tried: a quarter of the 2048 resident threads an SM holds.
constexpr int64_t kMinThreadsPerSm = 512;
// Split path: block size, and the smallest chunk of a group one block reduces/normalizes.
constexpr int kSplitBlock = 256;
constexpr int64_t kMinChunk = int64_t{kSplitBlock} * kItems;  // one round of the block
// Largest chunk: keeps in-chunk offsets in 32 bits and gives enough tiles for big tensors.
constexpr int64_t kMaxChunk = int64_t{1} << 20;
// Grid-stride loops: at most this many blocks per SM are launched (more only adds scheduling).
constexpr int64_t kMaxBlocksPerSm = 32;

constexpr unsigned kFullMask = 0xffffffffu;

// ---- reductions ----------------------------------------------------------------------------

// Sum over the `width` consecutive lanes (a power of two <= 32) that hold one group. The xor
// butterfly gives every lane the bitwise identical total (each pair adds the same two values).
template <class A>
__device__ __forceinline__ A subwarp_sum(A v, int width) {
  for (int off = width >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

// Sum over the tpg threads of one group (tpg a power of two; when > 32 the group is tpg / 32
// whole warps of the block). Every thread of the group gets the identical total. Must be called
// by all threads of the block (it synchronizes the block when tpg > 32). red: kMaxBlock / 32.
template <class A>
__device__ __forceinline__ A group_sum(A v, int tpg, A* red) {
  v = subwarp_sum(v, tpg < 32 ? tpg : 32);
  if (tpg <= 32) return v;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  if ((threadIdx.x & 31) == 0) red[warp] = v;
  __syncthreads();
  const int wpg = tpg >> 5;
  const int first = warp - warp % wpg;
  A total = A(0);
  for (int i = 0; i < wpg; ++i) total += red[first + i];
  __syncthreads();  // red may be overwritten by the next call
  return total;
}

// Moments and merge(): see group_norm_nhwc.cuh.

// Moments over the whole block (blockDim.x a multiple of 32, <= 1024); the result is valid in
// thread 0. Must be called by all threads of the block. sm: 32 entries.
template <class A>
__device__ Moments<A> block_moments(Moments<A> m, Moments<A>* sm) {
  for (int off = 16; off > 0; off >>= 1) {
    const A n = __shfl_down_sync(kFullMask, m.n, off);
    const A mean = __shfl_down_sync(kFullMask, m.mean, off);
    const A m2 = __shfl_down_sync(kFullMask, m.m2, off);
    merge(m, n, mean, m2);
  }
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  if (lane == 0) sm[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < warps ? sm[lane] : Moments<A>{A(0), A(0), A(0)};
    for (int off = 16; off > 0; off >>= 1) {
      const A n = __shfl_down_sync(kFullMask, m.n, off);
      const A mean = __shfl_down_sync(kFullMask, m.mean, off);
      const A m2 = __shfl_down_sync(kFullMask, m.m2, off);
      merge(m, n, mean, m2);
    }
  }
  __syncthreads();  // sm may be overwritten by the next call
  return m;
}

// ---- fused and cluster kernels -------------------------------------------------------------

// Writes one packed vector of y: elements e .. e+VEC-1 of group (n, g), whose first element is
// in channel ci (within the group) at spatial offset r. y = act((v - mean) * rstd * w[c] + b[c]).
template <class D, int VEC, class A>
__device__ __forceinline__ void normalize_store(D* __restrict__ yp, const A* v, int64_t c0, int64_t r, int64_t S,
                                                const D* __restrict__ w, const D* __restrict__ b, A mean,
                                                A rstd, Activation act) {
  Pack<D, VEC> out;
  int64_t c = c0;
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    // (v - mean) * rstd first: with rstd at A's largest value (see rstd_of) rstd * w may overflow.
    const A t = (v[k] - mean) * rstd;
    const A shift = b != nullptr ? to_acc(b[c]) : A(0);
    out.v[k] = from_acc<D>(activate(w != nullptr ? t * to_acc(w[c]) + shift : t + shift, act));
    if (++r == S) {
      r = 0;
      ++c;
    }
  }
  *reinterpret_cast<Pack<D, VEC>*>(yp) = out;
}

// Sum of one value per block over the blocks of the calling cluster (sm_90+), added in rank order
// so every block gets the bitwise identical total. part: a __shared__ A[2]; phases 0 and 1 use
// different slots because a slower block may still be reading slot 0 while a faster one writes
// slot 1; slot 0 is rewritten only after the next cluster barrier, which every block reaches
// after its reads. Must be called by all threads of every block of the cluster.
template <class A>
__device__ __forceinline__ A cluster_sum(A block_total, A* part, int phase) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  const cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) part[phase] = block_total;
  cluster.sync();
  A total = A(0);
  for (unsigned r = 0; r < cluster.num_blocks(); ++r) total += *cluster.map_shared_rank(&part[phase], r);
  return total;
#else
  __trap();  // the launcher never uses clusters below sm_90
  return block_total;
#endif
}

// Fused (CLUSTER = false): group ng = base + threadIdx.x / tpg is held by tpg consecutive threads.
// Cluster (CLUSTER = true): group ng is held by one cluster of K blocks; block `rank` holds
// elements [rank * slice, (rank + 1) * slice) and tpg == blockDim.x.
//   x, y: [NG, M] (NG = N * G groups of M = Cg * S elements); w, b: [G * Cg] or nullptr
//   sdiv: divides by S (element offset within a group -> channel within the group)
template <class D, int VEC, bool CLUSTER>
__global__ void __launch_bounds__(kMaxBlock, 1)
    group_norm_fused_kernel(const D* __restrict__ x, const D* __restrict__ w, const D* __restrict__ b,
                            D* __restrict__ y, int64_t NG, int64_t G, int64_t Cg, int M, int slice, FastDiv sdiv,
                            int tpg, double eps, Activation act) {
  using A = acc<D>;
  constexpr int kVecs = kItems / VEC;
  OPBRIDGE_SHARED_ARRAY(A, red, kMaxBlock / 32);
  OPBRIDGE_SHARED_ARRAY(A, part, 2);
  const int S = static_cast<int>(sdiv.d);

  int64_t base = 0, step = 1, sub = 0;
  int lane = 0, seg_begin = 0, seg_end = M;
  if constexpr (CLUSTER) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    const cg::cluster_group cluster = cg::this_cluster();
    const int rank = static_cast<int>(cluster.block_rank());
    const int K = static_cast<int>(cluster.num_blocks());
    base = blockIdx.x / K;
    step = gridDim.x / K;
    lane = static_cast<int>(threadIdx.x);
    seg_begin = min(M, rank * slice);
    seg_end = min(M, seg_begin + slice);
#else
    __trap();  // the launcher never uses clusters below sm_90
#endif
  } else {
    const int gpb = static_cast<int>(blockDim.x) / tpg;
    base = static_cast<int64_t>(blockIdx.x) * gpb;
    step = static_cast<int64_t>(gridDim.x) * gpb;
    sub = static_cast<int64_t>(threadIdx.x) / tpg;
    lane = static_cast<int>(threadIdx.x) % tpg;
  }

  // `base` advances uniformly over the block (cluster), so every thread runs the same number of
  // iterations and reaches every barrier; threads past the last group just carry zeros.
  for (; base < NG; base += step) {
    const int64_t ng = base + sub;
    const bool active = ng < NG;
    const D* xg = x + (active ? ng : 0) * static_cast<int64_t>(M);
    A v[kItems];
    A sum = A(0);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int e = seg_begin + (lane + j * tpg) * VEC;
      if (active && e < seg_end) {
        const Pack<D, VEC> p = *reinterpret_cast<const Pack<D, VEC>*>(xg + e);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          v[j * VEC + k] = to_acc(p.v[k]);
          sum += v[j * VEC + k];
        }
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[j * VEC + k] = A(0);
      }
    }

    // Pass 1: the mean. Pass 2: the sum of squared deviations, over the values in registers.
    A total = group_sum(sum, tpg, red);
    if constexpr (CLUSTER) total = cluster_sum(total, part, 0);
    const A mean = total / static_cast<A>(M);
    A sq = A(0);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int e = seg_begin + (lane + j * tpg) * VEC;
      if (active && e < seg_end) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A d = v[j * VEC + k] - mean;
          sq += d * d;
        }
      }
    }
    sq = group_sum(sq, tpg, red);
    if constexpr (CLUSTER) sq = cluster_sum(sq, part, 1);
    const A rstd = rstd_of<A>(static_cast<double>(sq / static_cast<A>(M)), eps);

    if (active) {
      const int64_t c_group = (ng % G) * Cg;  // first channel of the group
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        const int e = seg_begin + (lane + j * tpg) * VEC;
        if (e < seg_end) {
          const int q = static_cast<int>(sdiv.div(static_cast<uint32_t>(e)));
          normalize_store<D, VEC>(y + ng * static_cast<int64_t>(M) + e, v + j * VEC, c_group + q,
                                  static_cast<int64_t>(e - q * S), S, w, b, mean, rstd, act);
        }
      }
    }
  }
  if constexpr (CLUSTER) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    // No block may exit while another can still read its shared memory.
    cg::this_cluster().sync();
#endif
  } else {
    (void)part;
  }
}

// ---- split path ----------------------------------------------------------------------------

// Tile t = ng * K + k is chunk k (elements [k * chunk, min(M, (k + 1) * chunk))) of group ng.

// partial[t] = (mean, M2) of tile t (its count follows from chunk and M).
template <class D, int VEC>
__global__ void __launch_bounds__(kSplitBlock)
    group_norm_partial_kernel(const D* __restrict__ x, int64_t M, int64_t chunk, int64_t K, int64_t tiles,
                              acc<D>* __restrict__ partial) {
  using A = acc<D>;
  constexpr int kVecs = kItems / VEC;
  OPBRIDGE_SHARED_ARRAY(Moments<A>, sm, 32);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t ng = t / K, k = t - ng * K;
    const int64_t begin = k * chunk;
    const int len = static_cast<int>(min(chunk, M - begin));  // chunk <= kMaxChunk
    const D* xc = x + ng * M + begin;
    Moments<A> m{A(0), A(0), A(0)};
    // Each round loads kItems elements per thread (all loads in flight together), takes their
    // exact mean and M2 from registers, and merges them into the running moments once.
    for (int round = 0; round < len; round += kSplitBlock * kItems) {
      A v[kItems];
      A s = A(0);
      int cnt = 0;
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        const int e = round + (static_cast<int>(threadIdx.x) + j * kSplitBlock) * VEC;
        if (e < len) {
          const Pack<D, VEC> p = *reinterpret_cast<const Pack<D, VEC>*>(xc + e);
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            v[j * VEC + i] = to_acc(p.v[i]);
            s += v[j * VEC + i];
          }
          cnt += VEC;
        } else {
#pragma unroll
          for (int i = 0; i < VEC; ++i) v[j * VEC + i] = A(0);
        }
      }
      if (cnt > 0) {
        const A n = static_cast<A>(cnt);
        const A mean = s / n;
        A q = A(0);
#pragma unroll
        for (int j = 0; j < kVecs; ++j) {
          const int e = round + (static_cast<int>(threadIdx.x) + j * kSplitBlock) * VEC;
          if (e < len) {
#pragma unroll
            for (int i = 0; i < VEC; ++i) {
              const A d = v[j * VEC + i] - mean;
              q += d * d;
            }
          }
        }
        merge(m, n, mean, q);
      }
    }
    m = block_moments(m, sm);
    if (threadIdx.x == 0) {
      partial[2 * t] = m.mean;
      partial[2 * t + 1] = m.m2;
    }
  }
}

// stats[ng] = (mean, rstd) of group ng from its K tile moments, merged in double.
template <class A>
__global__ void __launch_bounds__(kSplitBlock)
    group_norm_finalize_kernel(const A* __restrict__ partial, int64_t NG, int64_t M, int64_t chunk, int64_t K,
                               double eps, A* __restrict__ stats) {
  OPBRIDGE_SHARED_ARRAY(Moments<double>, sm, 32);
  for (int64_t ng = blockIdx.x; ng < NG; ng += gridDim.x) {
    Moments<double> m{0.0, 0.0, 0.0};
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
      const double n = static_cast<double>(min(chunk, M - k * chunk));
      merge(m, n, static_cast<double>(partial[2 * (ng * K + k)]), static_cast<double>(partial[2 * (ng * K + k) + 1]));
    }
    m = block_moments(m, sm);
    if (threadIdx.x == 0) {
      // M2 is a sum of non-negative terms; NaN (a NaN or an infinity in the group) must reach
      // the output as in the fused path, not become a zero variance.
      const double var = m.m2 / static_cast<double>(M);
      stats[2 * ng] = static_cast<A>(m.mean);
      stats[2 * ng + 1] = rstd_of<A>(var, eps);
    }
  }
}

// y for tile t from the group statistics.
//   sdiv divides by S; used only when S <= chunk (then offsets stay below 2 * kMaxChunk)
template <class D, int VEC>
__global__ void __launch_bounds__(kSplitBlock)
    group_norm_apply_kernel(const D* __restrict__ x, const D* __restrict__ w, const D* __restrict__ b,
                            D* __restrict__ y, const acc<D>* __restrict__ stats, int64_t M, int64_t chunk, int64_t K,
                            int64_t tiles, int64_t G, int64_t Cg, int64_t S, FastDiv sdiv, Activation act) {
  using A = acc<D>;
  constexpr int kVecs = kItems / VEC;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t ng = t / K, k = t - ng * K;
    const int64_t begin = k * chunk;
    const int len = static_cast<int>(min(chunk, M - begin));
    const int64_t c_begin = (ng % G) * Cg + begin / S;  // channel of the chunk's first element
    const int64_t r_begin = begin % S;                  // and its spatial offset
    const A mean = stats[2 * ng], rstd = stats[2 * ng + 1];
    const D* xc = x + ng * M + begin;
    D* yc = y + ng * M + begin;
    for (int round = 0; round < len; round += kSplitBlock * kItems) {
      A v[kItems];
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        const int e = round + (static_cast<int>(threadIdx.x) + j * kSplitBlock) * VEC;
        if (e < len) {
          const Pack<D, VEC> p = *reinterpret_cast<const Pack<D, VEC>*>(xc + e);
#pragma unroll
          for (int i = 0; i < VEC; ++i) v[j * VEC + i] = to_acc(p.v[i]);
        }
      }
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        const int e = round + (static_cast<int>(threadIdx.x) + j * kSplitBlock) * VEC;
        if (e < len) {
          // Channel and spatial offset of element begin + e.
          const int64_t off = r_begin + e;
          int64_t c, r;
          if (S <= chunk) {
            const int64_t q = sdiv.div(static_cast<uint32_t>(off));  // off < S + chunk <= 2^21
            c = c_begin + q;
            r = off - q * S;
          } else {
            // A chunk shorter than a channel crosses at most one channel boundary.
            const bool next = off >= S;
            c = c_begin + (next ? 1 : 0);
            r = next ? off - S : off;
          }
          normalize_store<D, VEC>(yc + e, v + j * VEC, c, r, S, w, b, mean, rstd, act);
        }
      }
    }
  }
}

// ---- channels_last ([N, S, C]) path ---------------------------------------------------------

// Merges the moments of `count` entries spread over the lanes of the calling warp (lane l takes
// entries l, l + 32, ...); the total is valid in lane 0. Must be called by the whole warp.
template <class A, class Get>
__device__ __forceinline__ Moments<A> warp_merge(int count, Get get) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  Moments<A> m{A(0), A(0), A(0)};
  for (int e = lane; e < count; e += 32) {
    const Moments<A> o = get(e);
    merge(m, o.n, o.mean, o.m2);
  }
  for (int off = 16; off > 0; off >>= 1) {
    const A n = __shfl_down_sync(kFullMask, m.n, off);
    const A mean = __shfl_down_sync(kFullMask, m.mean, off);
    const A m2 = __shfl_down_sync(kFullMask, m.m2, off);
    merge(m, n, mean, m2);
  }
  return m;
}

// partial[(n * K + k) * U + unit] = (mean, M2) of every unit of tile (n, k, cb); see
// group_norm_nhwc.cuh. blockDim.x == kNhwcBlock.
template <class D, int VEC>
__global__ void __launch_bounds__(kNhwcBlock)
    group_norm_nhwc_partial_kernel(const D* __restrict__ x, NhwcPlan p, int64_t tiles, acc<D>* __restrict__ partial) {
  using A = acc<D>;
  OPBRIDGE_SHARED_ARRAY(Moments<A>, sm, kNhwcBlock);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t cb = t % p.CBn, nk = t / p.CBn;
    const int64_t k = nk % p.K, n = nk / p.K;
    const NhwcBlock b = nhwc_block(p, cb);
    const NhwcThreads th = nhwc_threads(b, VEC, kNhwcBlock);
    sm[tid] = nhwc_thread_moments<VEC, kItems, D, A>(x, p, b, th, n, k, tid);
    __syncthreads();
    const int entries = nhwc_entries(b, th, VEC);
    for (int lu = warp; lu < b.units; lu += kNhwcBlock / 32) {  // uniform per warp
      const Moments<A> m =
          warp_merge<A>(entries, [&](int e) { return sm[nhwc_entry_thread(b, th, VEC, lu, e)]; });
      if (lane == 0) {
        const int64_t i = nhwc_partial_index(p, n, k, b.unit0 + lu);
        partial[2 * i] = m.mean;
        partial[2 * i + 1] = m.m2;
      }
    }
    __syncthreads();  // sm is rewritten by the next tile
  }
}

// stats[n * G + g] = (mean, rstd) from the group's K * PC partials, merged in double.
template <class A>
__global__ void __launch_bounds__(kSplitBlock)
    group_norm_nhwc_finalize_kernel(const A* __restrict__ partial, NhwcPlan p, double eps, A* __restrict__ stats) {
  OPBRIDGE_SHARED_ARRAY(Moments<double>, sm, 32);
  const int64_t NG = p.N * p.G;
  const int64_t per_group = p.K * p.PC;
  for (int64_t ng = blockIdx.x; ng < NG; ng += gridDim.x) {
    const int64_t n = ng / p.G, g = ng - n * p.G;
    Moments<double> m{0.0, 0.0, 0.0};
    for (int64_t j = threadIdx.x; j < per_group; j += blockDim.x) {
      const int64_t k = j / p.PC, pc = j - k * p.PC;
      const int64_t i = nhwc_partial_index(p, n, k, g * p.PC + pc);
      const double cnt = static_cast<double>(nhwc_tile_rows(p, k) * nhwc_unit_width(p, pc));
      merge(m, cnt, static_cast<double>(partial[2 * i]), static_cast<double>(partial[2 * i + 1]));
    }
    m = block_moments(m, sm);
    if (threadIdx.x == 0) {
      const double var = m.m2 / static_cast<double>(p.S * p.Cg);  // NaN propagates (see above)
      stats[2 * ng] = static_cast<A>(m.mean);
      stats[2 * ng + 1] = rstd_of<A>(var, eps);
    }
  }
}

// y = act((x - mean) * rstd * w + b) over [N, S, C]; thread layout: nhwc_apply_threads.
//   sdiv: divides a row index by S (used when N * S < 2^31; else 64-bit division)
//   gdiv: divides a channel by Cg (C < 2^31 always holds here: the launcher checks)
template <class D, int VEC>
__global__ void __launch_bounds__(kNhwcBlock)
    group_norm_nhwc_apply_kernel(const D* __restrict__ x, const D* __restrict__ w, const D* __restrict__ b,
                                 D* __restrict__ y, const acc<D>* __restrict__ stats, int64_t rows, int64_t S,
                                 int64_t C, int64_t G, int cols, int rpp, FastDiv sdiv, bool small_rows,
                                 FastDiv gdiv, Activation act) {
  using A = acc<D>;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid >= cols * rpp) return;  // no barriers below
  const int64_t CV = C / VEC;
  const int cv0 = tid % cols, ry = tid / cols;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * rpp + ry; row < rows;
       row += static_cast<int64_t>(gridDim.x) * rpp) {
    const int64_t n = small_rows ? static_cast<int64_t>(sdiv.div(static_cast<uint32_t>(row))) : row / S;
    const A* st = stats + 2 * n * G;
    for (int64_t cv = cv0; cv < CV; cv += cols) {
      const int64_t c = cv * VEC;
      const int64_t g = gdiv.div(static_cast<uint32_t>(c));
      const A mean = st[2 * g], rstd = st[2 * g + 1];
      const int64_t off = row * C + c;
      const Pack<D, VEC> in = *reinterpret_cast<const Pack<D, VEC>*>(x + off);
      Pack<D, VEC> out;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const A t = (to_acc(in.v[i]) - mean) * rstd;  // before * w: see normalize_store
        const A shift = b != nullptr ? to_acc(b[c + i]) : A(0);
        out.v[i] = from_acc<D>(activate(w != nullptr ? t * to_acc(w[c + i]) + shift : t + shift, act));
      }
      *reinterpret_cast<Pack<D, VEC>*>(y + off) = out;
    }
  }
}

// ---- host side -----------------------------------------------------------------------------

bool aligned16(const void* p) { return aligned_to(p, 16); }

// Whether the cluster kernel can run on the current device with the largest configuration
// (8 blocks of 512 threads). Cached per device.
template <class D, int VEC>
bool cluster_supported(const DeviceInfo& dev) {
  if (dev.cc_major < 9) return false;
  constexpr int kDevices = 64;
  static std::atomic<int> cache[kDevices];  // zero-initialized: 0 = unknown, 1 = no, 2 = yes
  if (dev.device >= 0 && dev.device < kDevices) {
    const int c = cache[dev.device].load(std::memory_order_relaxed);
    if (c != 0) return c == 2;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kMaxCluster);
  cfg.blockDim = dim3(kMaxBlock);
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kMaxCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, group_norm_fused_kernel<D, VEC, true>, &cfg);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // a failed query must not surface as a later, unrelated error
    clusters = 0;
  }
  if (dev.device >= 0 && dev.device < kDevices) cache[dev.device].store(clusters > 0 ? 2 : 1, std::memory_order_relaxed);
  return clusters > 0;
}

struct Sizes {
  int64_t N, C, S, G, NG, Cg, M;
};

template <class D, int VEC>
cudaError_t launch_fused(Stream stream, const DeviceInfo& dev, const D* x, const D* w, const D* b, D* y,
                         const Sizes& z, double eps, Activation act) {
  const int64_t nvec = z.M / VEC;
  // Threads per group: enough to hold it (kItems per thread), and for small groups at least one
  // vector per thread (up to a warp), so consecutive lanes read consecutive memory.
  const int tpg = next_pow2(std::max<int64_t>(std::min<int64_t>(nvec, 32), ceil_div(nvec, kItems / VEC)));
  const int64_t cap = dev.sm_count * kMaxBlocksPerSm;
  const FastDiv sdiv(static_cast<uint32_t>(z.S));
  const double e = eps;

  // Too few threads in all to keep the SMs busy: split each group over a cluster instead.
  if (z.M > kFusedMax || (z.NG * tpg < dev.sm_count * kMinThreadsPerSm && z.M >= 2 * kMinSlice)) {
    if (cluster_supported<D, VEC>(dev)) {
      int64_t K = ceil_div(z.M, kFusedMax);
      const int64_t want = ceil_div(dev.sm_count * kMinThreadsPerSm, z.NG * kMaxBlock);
      K = std::max(K, std::min<int64_t>({kMaxCluster, want, z.M / kMinSlice}));
      K = std::max<int64_t>(1, std::min<int64_t>(K, kMaxCluster));
      const int64_t slice = round_up(ceil_div(z.M, K), VEC);  // <= kFusedMax
      const int threads = std::max(32, next_pow2(ceil_div(slice / VEC, kItems / VEC)));
      const int64_t clusters = std::min<int64_t>(z.NG, std::max<int64_t>(1, cap / K));
      LaunchShape shape{dim3(static_cast<unsigned>(clusters * K)), dim3(threads), 0, static_cast<unsigned>(K)};
      return launch(group_norm_fused_kernel<D, VEC, true>, shape, stream, x, w, b, y, z.NG, z.G, z.Cg,
                    static_cast<int>(z.M), static_cast<int>(slice), sdiv, threads, e, act);
    }
    if (z.M > kFusedMax) return cudaErrorNotSupported;  // caller falls back to the split path
  }
  const int threads = std::max(tpg, 256);  // 256: enough warps per block to hide latency
  const int64_t gpb = threads / tpg;
  const int64_t blocks = std::min(ceil_div(z.NG, gpb), cap);
  LaunchShape shape{dim3(static_cast<unsigned>(blocks)), dim3(threads), 0, 1};
  return launch(group_norm_fused_kernel<D, VEC, false>, shape, stream, x, w, b, y, z.NG, z.G, z.Cg,
                static_cast<int>(z.M), static_cast<int>(z.M), sdiv, tpg, e, act);
}

// Workspace layout of the split path: partial moments [NG * K, 2], then stats [NG, 2].
template <class A>
size_t split_workspace_bytes(int64_t NG, int64_t M) {
  const int64_t k_max = ceil_div(M, kMinChunk);
  return static_cast<size_t>(round_up(NG * k_max * 2 * static_cast<int64_t>(sizeof(A)), 16) +
                             NG * 2 * static_cast<int64_t>(sizeof(A)));
}

template <class D, int VEC>
cudaError_t launch_split(Stream stream, const DeviceInfo& dev, const D* x, const D* w, const D* b, D* y,
                         const Sizes& z, double eps, Activation act, void* workspace, size_t workspace_bytes) {
  using A = acc<D>;
  if (workspace == nullptr || workspace_bytes < split_workspace_bytes<A>(z.NG, z.M) || !aligned16(workspace)) {
    return cudaErrorInvalidValue;
  }
  // Chunks sized so that all groups together give about kMaxBlocksPerSm / 4 tiles per SM (load
  // balance of the two streaming kernels; larger chunks mean fewer partials to merge), a
  // multiple of one block round, and at most kMaxChunk.
  const int64_t target_tiles = dev.sm_count * (kMaxBlocksPerSm / 4);
  int64_t chunk = round_up(ceil_div(z.M * z.NG, target_tiles), kMinChunk);
  chunk = std::min(std::max(chunk, kMinChunk), kMaxChunk);
  const int64_t K = ceil_div(z.M, chunk);
  const int64_t tiles = z.NG * K;
  A* partial = static_cast<A*>(workspace);
  A* stats = reinterpret_cast<A*>(static_cast<char*>(workspace) + round_up(tiles * 2 * sizeof(A), 16));
  const int64_t cap = dev.sm_count * kMaxBlocksPerSm;
  const LaunchShape tile_shape{dim3(static_cast<unsigned>(std::min(tiles, cap))), dim3(kSplitBlock), 0, 1};
  cudaError_t e = launch(group_norm_partial_kernel<D, VEC>, tile_shape, stream, x, z.M, chunk, K, tiles, partial);
  if (e != cudaSuccess) return e;
  const LaunchShape group_shape{dim3(static_cast<unsigned>(std::min(z.NG, cap))), dim3(kSplitBlock), 0, 1};
  e = launch(group_norm_finalize_kernel<A>, group_shape, stream, partial, z.NG, z.M, chunk, K, eps, stats);
  if (e != cudaSuccess) return e;
  // S <= chunk <= 2^20 keeps the divided offsets below 2^31; larger S does not divide at all.
  const FastDiv sdiv(static_cast<uint32_t>(z.S <= chunk ? z.S : 1));
  return launch(group_norm_apply_kernel<D, VEC>, tile_shape, stream, x, w, b, y, stats, z.M, chunk, K, tiles, z.G,
                z.Cg, z.S, sdiv, act);
}

template <class D, int VEC>
cudaError_t dispatch(Stream stream, const D* x, const D* w, const D* b, D* y, const Sizes& z, double eps,
                     Activation act, void* workspace, size_t workspace_bytes) {
  DeviceInfo dev;
  const cudaError_t e = current_device_info(&dev);
  if (e != cudaSuccess) return e;
  if (z.M <= kClusterMax) {
    const cudaError_t f = launch_fused<D, VEC>(stream, dev, x, w, b, y, z, eps, act);
    if (f != cudaErrorNotSupported) return f;
  }
  return launch_split<D, VEC>(stream, dev, x, w, b, y, z, eps, act, workspace, workspace_bytes);
}

// Workspace layout of the channels_last path: partial moments [N * K * U, 2], then stats [N * G, 2].
template <class A>
int64_t nhwc_partial_bytes(const NhwcPlan& p) {
  return round_up(p.N * p.K * p.U * 2 * static_cast<int64_t>(sizeof(A)), 16);
}
template <class A>
size_t nhwc_workspace_bytes(const NhwcPlan& p) {
  return static_cast<size_t>(nhwc_partial_bytes<A>(p) + p.N * p.G * 2 * static_cast<int64_t>(sizeof(A)));
}

template <class D, int VEC>
cudaError_t launch_nhwc(Stream stream, const D* x, const D* w, const D* b, D* y, const NhwcPlan& p, double eps,
                        Activation act, void* workspace, size_t workspace_bytes) {
  using A = acc<D>;
  if (workspace == nullptr || workspace_bytes < nhwc_workspace_bytes<A>(p) || !aligned16(workspace)) {
    return cudaErrorInvalidValue;
  }
  DeviceInfo dev;
  cudaError_t e = current_device_info(&dev);
  if (e != cudaSuccess) return e;
  A* partial = static_cast<A*>(workspace);
  A* stats = reinterpret_cast<A*>(static_cast<char*>(workspace) + nhwc_partial_bytes<A>(p));
  const int64_t cap = dev.sm_count * kMaxBlocksPerSm;
  const int64_t tiles = p.N * p.K * p.CBn;
  const LaunchShape tile_shape{dim3(static_cast<unsigned>(std::min(tiles, cap))), dim3(kNhwcBlock), 0, 1};
  e = launch(group_norm_nhwc_partial_kernel<D, VEC>, tile_shape, stream, x, p, tiles, partial);
  if (e != cudaSuccess) return e;
  const LaunchShape group_shape{dim3(static_cast<unsigned>(std::min(p.N * p.G, cap))), dim3(kSplitBlock), 0, 1};
  e = launch(group_norm_nhwc_finalize_kernel<A>, group_shape, stream, partial, p, eps, stats);
  if (e != cudaSuccess) return e;
  const NhwcThreads at = nhwc_apply_threads(p.C, VEC, kNhwcBlock);
  const int cols = at.cols, rpp = at.rpp;
  const int64_t rows = p.N * p.S;
  const bool small_rows = rows < (int64_t{1} << 31);
  const FastDiv sdiv(static_cast<uint32_t>(small_rows ? p.S : 1));
  const FastDiv gdiv(static_cast<uint32_t>(p.Cg));
  const LaunchShape row_shape{dim3(static_cast<unsigned>(std::min(ceil_div(rows, rpp), cap))), dim3(kNhwcBlock), 0, 1};
  return launch(group_norm_nhwc_apply_kernel<D, VEC>, row_shape, stream, x, w, b, y, stats, rows, p.S, p.C, p.G,
                cols, rpp, sdiv, small_rows, gdiv, act);
}

// A single channel, or a single spatial position, is the same memory in both layouts: the
// [N, C, S] kernels handle it (one read and one write for small groups, no workspace).
bool takes_nhwc_path(const GroupNormDims& d) { return d.channels_last && d.C > 1 && d.S > 1; }

}  // namespace

template <class T>
size_t group_norm_workspace_bytes(const GroupNormDims& d) {
  using A = acc<typename DeviceType<T>::type>;
  if (d.N <= 0 || d.C <= 0 || d.S <= 0 || d.G <= 0 || d.C % d.G != 0) return 0;
  if (takes_nhwc_path(d)) return nhwc_workspace_bytes<A>(make_nhwc_plan(d.N, d.S, d.C, d.G));
  const int64_t M = d.C / d.G * d.S;
  // Groups that fit one block always take the fused path; larger ones may take the split path
  // (which one depends on the device, the size returned here must not).
  if (M <= kFusedMax) return 0;
  return split_workspace_bytes<A>(d.N * d.G, M);
}

template <class T>
cudaError_t launch_group_norm(cudaStream_t stream, const T* x, const T* weight, const T* bias, T* y,
                              const GroupNormParams& p, void* workspace, size_t workspace_bytes) {
  const GroupNormDims& d = p.d;
  const double eps = p.eps;
  const Activation act = p.act;
  using D = typename DeviceType<T>::type;
  if (d.N < 0 || d.C < 0 || d.S < 0 || d.G <= 0 || d.C % d.G != 0) return cudaErrorInvalidValue;
  if (act != Activation::kNone && act != Activation::kSilu) return cudaErrorInvalidValue;
  if (d.N == 0 || d.C == 0 || d.S == 0) return cudaSuccess;  // empty output: nothing to do
  const D* xd = reinterpret_cast<const D*>(x);
  const D* wd = reinterpret_cast<const D*>(weight);
  const D* bd = reinterpret_cast<const D*>(bias);
  D* yd = reinterpret_cast<D*>(y);
  const Stream st{stream};
  if (takes_nhwc_path(d)) {
    // Channels are divided in 32 bits in the apply kernel.
    if (d.C >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
    const NhwcPlan plan = make_nhwc_plan(d.N, d.S, d.C, d.G);
    // 128-bit accesses need every group's channels in whole vectors, and x and y aligned (then
    // every vector is). Otherwise scalar accesses, still coalesced along the channels.
    constexpr int kVec = 16 / sizeof(D);
    if (plan.Cg % kVec == 0 && aligned16(x) && aligned16(y)) {
      return launch_nhwc<D, kVec>(st, xd, wd, bd, yd, plan, eps, act, workspace, workspace_bytes);
    }
    return launch_nhwc<D, 1>(st, xd, wd, bd, yd, plan, eps, act, workspace, workspace_bytes);
  }
  Sizes z{d.N, d.C, d.S, d.G, d.N * d.G, d.C / d.G, d.C / d.G * d.S};
  constexpr int kVec = 16 / sizeof(D);
  // 128-bit accesses need every group (M elements) to start 16-byte aligned.
  if (z.M % kVec == 0 && aligned16(x) && aligned16(y)) {
    return dispatch<D, kVec>(st, xd, wd, bd, yd, z, eps, act, workspace, workspace_bytes);
  }
  return dispatch<D, 1>(st, xd, wd, bd, yd, z, eps, act, workspace, workspace_bytes);
}

#define OPBRIDGE_INSTANTIATE_GROUP_NORM_CUDA(T)                                                           \
  template size_t group_norm_workspace_bytes<T>(const GroupNormDims&);                                 \
  template cudaError_t launch_group_norm<T>(cudaStream_t, const T*, const T*, const T*, T*, const GroupNormParams&, \
                                            void*, size_t);

OPBRIDGE_FOR_EACH_FLOAT_TYPE(OPBRIDGE_INSTANTIATE_GROUP_NORM_CUDA)

// ---- the compute function (opbridge/kernel.h) --------------------------------------------------
// GroupNorm on the framework's stream (torch's current one, ORT's compute stream), with scratch
// memory from the framework's allocator. The backward has no CUDA kernel: on CUDA tensors torch
// computes it with a composite of its own ops (opbridge/ops/group_norm.py).

namespace {

Status forward(const KernelCall& k) {
  const GroupNormParams p = group_norm_params(k);
  return dispatch<float, double, Half, BFloat16>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    const size_t ws_bytes = group_norm_workspace_bytes<T>(p.d);
    void* ws = k.scratch(ws_bytes);
    return cuda_status(launch_group_norm<T>(static_cast<cudaStream_t>(k.stream()), k.in<T>("x"), k.in<T>("weight"),
                                            k.in<T>("bias"), k.out<T>(0), p, ws, ws_bytes));
  });
}

}  // namespace

}  // namespace opbridge::cuda

OPBRIDGE_KERNEL(opbridge::group_norm_decl, kCuda, opbridge::cuda::forward);
