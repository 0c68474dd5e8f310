// GroupNorm on channels_last ([N, S, C]) memory: the work decomposition and per-thread index
// math of the NHWC kernels in group_norm_kernel.cu. Host-device code with no CUDA-only calls,
// so tests/cuda_ops/cuda_host/ compiles it with the host compiler and checks it against a float64
// reference on machines without a GPU. The including file provides to_acc(D) for its types.
//
// A group (n, g) is the Cg channels [g * Cg, (g + 1) * Cg) of every row s of sample n: S short
// runs of Cg elements, C apart. Three kernels:
//   partial   tile (n, k, cb): rows [k * R, min(S, (k + 1) * R)) of sample n, channel block cb
//             (whole groups, gpb of them, when Cg <= kNhwcWidth; else one piece of kNhwcWidth
//             channels of one group). Threads read consecutive channel vectors of a row
//             (coalesced), keep exact per-round moments in registers and merge them (Chan et
//             al.); the block then merges the moments of each unit (a group, or a piece of one)
//             and writes them: partial[(n * K + k) * U + unit].
//   finalize  per group: merges its K * PC partials in double -> (mean, rstd).
//   apply     elementwise over [N, S, C], vectorized over channels: y = act((x - mean) * rstd *
//             w + b). Reads x a second time (from L2 where it still is).
// Every vector of VEC channels lies in one group (VEC divides Cg), so a thread's values all
// belong to one unit.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OPBRIDGE_HD __host__ __device__ __forceinline__
#else
#define OPBRIDGE_HD inline
#endif

namespace opbridge::cuda {

// Channels of one partial block (the fixed width keeps the plan independent of the vector width:
// 256 threads cover it with one channel each, or 4 rows at a time with 4-channel vectors).
inline constexpr int64_t kNhwcWidth = 256;
inline constexpr int kNhwcBlock = 256;
// Elements per partial tile (rows R = kNhwcTileElems / block width): 32 KiB of float32.
inline constexpr int64_t kNhwcTileElems = 8192;

// VEC elements loaded as one access (the caller guarantees the alignment).
template <class D, int VEC>
struct alignas(sizeof(D) * VEC) NhwcVec {
  D v[VEC];
};

// (count, mean, M2) of a set of values; merged with Chan et al.'s formula, which never subtracts
// two large sums, so the variance keeps its precision whatever the data's offset.
template <class A>
struct Moments {
  A n, mean, m2;
};

template <class A>
OPBRIDGE_HD void merge(Moments<A>& a, A nb, A mean_b, A m2_b) {
  if (nb == A(0)) return;
  const A n = a.n + nb;
  const A d = mean_b - a.mean;
  const A f = nb / n;
  a.mean += d * f;
  a.m2 += m2_b + d * d * a.n * f;
  a.n = n;
}

// The decomposition of one call; computed on the host from the sizes alone (not the device),
// so the workspace size is known before launching.
struct NhwcPlan {
  int64_t N, S, C, G, Cg;
  int64_t PC;   // pieces per group: 1 when a block holds whole groups
  int64_t gpb;  // groups per channel block (1 when PC > 1)
  int64_t CBn;  // channel blocks per row tile
  int64_t U;    // units (groups or pieces) per (n, k): G * PC
  int64_t R;    // rows per tile
  int64_t K;    // tiles per sample: ceil(S / R)
};

inline NhwcPlan make_nhwc_plan(int64_t N, int64_t S, int64_t C, int64_t G) {
  NhwcPlan p{};
  p.N = N;
  p.S = S;
  p.C = C;
  p.G = G;
  p.Cg = C / G;
  int64_t width;
  if (p.Cg <= kNhwcWidth) {
    p.PC = 1;
    p.gpb = kNhwcWidth / p.Cg;
    p.CBn = (G + p.gpb - 1) / p.gpb;
    width = (p.gpb < G ? p.gpb : G) * p.Cg;
  } else {
    p.PC = (p.Cg + kNhwcWidth - 1) / kNhwcWidth;
    p.gpb = 1;
    p.CBn = G * p.PC;
    width = kNhwcWidth;
  }
  p.U = G * p.PC;
  p.R = kNhwcTileElems / width > 1 ? kNhwcTileElems / width : 1;
  p.K = (S + p.R - 1) / p.R;
  return p;
}

// Width of piece pc of a group (the group itself when PC == 1).
OPBRIDGE_HD int64_t nhwc_unit_width(const NhwcPlan& p, int64_t pc) {
  if (p.PC == 1) return p.Cg;
  const int64_t rest = p.Cg - pc * kNhwcWidth;
  return rest < kNhwcWidth ? rest : kNhwcWidth;
}

// Rows of tile k.
OPBRIDGE_HD int64_t nhwc_tile_rows(const NhwcPlan& p, int64_t k) {
  const int64_t rest = p.S - k * p.R;
  return rest < p.R ? rest : p.R;
}

// Channel block cb of a row tile: channels [cbeg, cbeg + width), holding `units` units of uw
// channels each, the first being unit `unit0` (unit = g * PC + pc).
struct NhwcBlock {
  int64_t cbeg;
  int64_t unit0;
  int width, units, uw;
};

OPBRIDGE_HD NhwcBlock nhwc_block(const NhwcPlan& p, int64_t cb) {
  NhwcBlock b{};
  if (p.PC == 1) {
    const int64_t g0 = cb * p.gpb;
    const int64_t ng = p.G - g0 < p.gpb ? p.G - g0 : p.gpb;
    b.cbeg = g0 * p.Cg;
    b.unit0 = g0;
    b.units = static_cast<int>(ng);
    b.uw = static_cast<int>(p.Cg);
    b.width = static_cast<int>(ng * p.Cg);
  } else {
    const int64_t g = cb / p.PC, pc = cb - g * p.PC;
    b.cbeg = g * p.Cg + pc * kNhwcWidth;
    b.unit0 = cb;
    b.units = 1;
    b.uw = static_cast<int>(nhwc_unit_width(p, pc));
    b.width = b.uw;
  }
  return b;
}

// Thread layout of a partial block: thread tid < cols * rpp reads channel vector tid % cols of
// rows ry, ry + rpp, ... (ry = tid / cols) of its tile; the others idle.
struct NhwcThreads {
  int cols, rpp;
};

OPBRIDGE_HD NhwcThreads nhwc_threads(const NhwcBlock& b, int vec, int threads) {
  NhwcThreads t{};
  t.cols = b.width / vec;
  t.rpp = threads / t.cols;
  return t;
}

// Moments of the values thread `tid` reads in tile (n, k) of block b: rounds of ITEMS values
// (ITEMS / VEC rows) are loaded together, their exact mean and M2 taken from registers, and
// merged into the running moments once per round.
template <int VEC, int ITEMS, class D, class A>
OPBRIDGE_HD Moments<A> nhwc_thread_moments(const D* __restrict__ x, const NhwcPlan& p, const NhwcBlock& b,
                                           const NhwcThreads& t, int64_t n, int64_t k, int tid) {
  constexpr int kRows = ITEMS / VEC;
  Moments<A> m{A(0), A(0), A(0)};
  if (tid >= t.cols * t.rpp) return m;
  const int cv = tid % t.cols, ry = tid / t.cols;
  const int64_t r_begin = k * p.R, r_end = r_begin + nhwc_tile_rows(p, k);
  const D* xc = x + n * p.S * p.C + b.cbeg + static_cast<int64_t>(cv) * VEC;
  const int64_t step = t.rpp * p.C;  // elements between a thread's consecutive rows
  for (int64_t r0 = r_begin + ry; r0 < r_end; r0 += static_cast<int64_t>(kRows) * t.rpp) {
    const D* src = xc + r0 * p.C;
    A v[ITEMS];
    A s = A(0);
    int cnt = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < kRows; ++j) {
      const int64_t r = r0 + static_cast<int64_t>(j) * t.rpp;
      if (r < r_end) {
        const NhwcVec<D, VEC> pk = *reinterpret_cast<const NhwcVec<D, VEC>*>(src + j * step);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
        for (int i = 0; i < VEC; ++i) {
          v[j * VEC + i] = to_acc(pk.v[i]);
          s += v[j * VEC + i];
        }
        cnt += VEC;
      } else {
        for (int i = 0; i < VEC; ++i) v[j * VEC + i] = A(0);
      }
    }
    if (cnt > 0) {
      const A cn = static_cast<A>(cnt);
      const A mean = s / cn;
      A q = A(0);
      for (int j = 0; j < kRows; ++j) {
        if (r0 + static_cast<int64_t>(j) * t.rpp < r_end) {
          for (int i = 0; i < VEC; ++i) {
            const A d = v[j * VEC + i] - mean;
            q += d * d;
          }
        }
      }
      merge(m, cn, mean, q);
    }
  }
  return m;
}

// Entry e (0 <= e < entries) of unit lu of block b: the index of the thread whose moments it is.
OPBRIDGE_HD int nhwc_entries(const NhwcBlock& b, const NhwcThreads& t, int vec) { return (b.uw / vec) * t.rpp; }
OPBRIDGE_HD int nhwc_entry_thread(const NhwcBlock& b, const NhwcThreads& t, int vec, int lu, int e) {
  const int ucols = b.uw / vec;
  const int ry = e / ucols, c = e - ry * ucols;
  return ry * t.cols + lu * ucols + c;
}

// Thread layout of the apply kernel: thread tid < cols * rpp handles channel vectors cv0, cv0 +
// cols, ... (cv0 = tid % cols) of rows ry, ry + rpp, ... (ry = tid / cols) of the block's rows.
OPBRIDGE_HD NhwcThreads nhwc_apply_threads(int64_t C, int vec, int threads) {
  NhwcThreads t{};
  const int64_t cv = C / vec;
  t.cols = static_cast<int>(cv < threads ? cv : threads);
  t.rpp = threads / t.cols;
  return t;
}

// Index of the partial moments of unit u of tile (n, k).
OPBRIDGE_HD int64_t nhwc_partial_index(const NhwcPlan& p, int64_t n, int64_t k, int64_t u) {
  return (n * p.K + k) * p.U + u;
}

}  // namespace opbridge::cuda
