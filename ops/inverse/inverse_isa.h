// Inverse's kernels (internal header), compiled once per instruction set: inverse_cpu.cpp for the
// architecture's baseline (SSE2 / NEON: 16-byte vectors), inverse_cpu_isa.cpp once per x86-64 set
// (opbridge_add_op defines OPBRIDGE_ISA_AVX2 or OPBRIDGE_ISA_AVX512 and adds that set's flags:
// 32- or 64-byte vectors). Everything here but the entry points at the end has internal linkage,
// so that each of those files keeps its own copy, compiled with its own flags.
//
// Arithmetic shared by every kernel (Gauss-Jordan with partial pivoting, in place):
//   pivot step k, pivot row r_k with pivot a = r_k[k]:
//     every other row i:  l_i = r_i[k] / a;  r_i[j] -= l_i * r_k[j] (j != k);  r_i[k] = -l_i
//     then the pivot row: r_k[j] /= a (as * (1/a)) for j != k;  r_k[k] = 1/a
// The multipliers are true quotients, as in LAPACK's unblocked LU: a row equal to (or a
// power-of-two multiple of) the pivot row gets an exact multiplier and is eliminated to exact
// zeros, so such singular matrices are reported as singular rather than inverted into garbage.
// In-place Gauss-Jordan turns the row interchanges into column interchanges of the result,
// undone at the end.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "inverse.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

// The widest vector a kernel may use, in bytes.
#if defined(OPBRIDGE_ISA_AVX512)
#define OPBRIDGE_INVERSE_MAX_VEC_BYTES 64
#elif defined(OPBRIDGE_ISA_AVX2)
#define OPBRIDGE_INVERSE_MAX_VEC_BYTES 32
#else
#define OPBRIDGE_INVERSE_MAX_VEC_BYTES 16
#endif

namespace opbridge::inverse_impl {

// A kernel's result: kOk, or the step k at which the pivot U[k,k] is zero.
inline constexpr int kOk = -1;

// The first failure in a range of the batch: its batch index and step, or {-1, kOk}.
struct Failure {
  int64_t index;
  int step;
};

namespace {

// |v| as an unsigned integer that orders like |v| and puts NaN above +inf (IEEE-754 magnitudes
// compare like their bit patterns), so the pivot search needs only integer compares, which
// compile to conditional moves.
template <class T>
inline std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t> magnitude_key(T v) {
  const T a = std::fabs(v);
  std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t> u;
  std::memcpy(&u, &a, sizeof u);
  return u;
}

// Index of the pivot among col[k..n): the largest magnitude, the first on ties (as LAPACK's
// i?amax). A NaN wins, so that NaN inputs give NaN outputs instead of a misleading "singular"
// error. Branch-free: pivot rows of random matrices are unpredictable, and a mispredicted
// branch also keeps the CPU from overlapping the independent inversions of consecutive
// matrices.
template <class T>
inline int pivot_in_column(const T* col, int k, int n) {
  int p = k;
  auto best = magnitude_key(col[k]);
  for (int i = k + 1; i < n; ++i) {
    const auto v = magnitude_key(col[i]);
    const bool take = v > best;
    p = take ? i : p;
    best = take ? v : best;
  }
  return p;
}

// The column order that undoes in-place Gauss-Jordan's row interchanges: column j of the
// inverse is column c[j] of the eliminated matrix.
inline void column_order(const int* piv, int* c, int n) {
  std::iota(c, c + n, 0);
  for (int k = n - 1; k >= 0; --k) std::swap(c[k], c[piv[k]]);
}

// The same, in place in m (n x n), row by row (a column at a time would touch every row's
// cache line n times); tmp holds n elements and c n ints.
template <class T>
void unscramble_columns(T* m, int n, const int* piv, T* tmp, int* c) {
  column_order(piv, c, n);
  for (int64_t i = 0; i < n; ++i) {
    T* row = m + i * n;
    std::copy(row, row + n, tmp);
    for (int j = 0; j < n; ++j) row[j] = tmp[c[j]];
  }
}

// 2 x 2 float matrix through its adjugate, in double (see the file comment). The zero pivot
// reported is the one partial pivoting would meet.
inline int invert_2x2_f32(const float* a, float* out) {
  const double a00 = a[0], a01 = a[1], a10 = a[2], a11 = a[3];
  const double det = a00 * a11 - a01 * a10;
  if (det == 0.0) return (a00 == 0.0 && a10 == 0.0) ? 0 : 1;
  const double r = 1.0 / det;
  out[0] = static_cast<float>(a11 * r);
  out[1] = static_cast<float>(-a01 * r);
  out[2] = static_cast<float>(-a10 * r);
  out[3] = static_cast<float>(a00 * r);
  return kOk;
}

template <class T>
Failure run_1x1(const T* a, T* out, int64_t begin, int64_t end) {
  for (int64_t b = begin; b < end; ++b) {
    if (a[b] == T(0)) return {b, 0};
    out[b] = T(1) / a[b];
  }
  return {-1, kOk};
}

// SIMD vectors of B bytes through the GCC/Clang vector extension, with the same-size integer
// vector used for lane masks.
template <class T, int B>
struct Simd {
  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  static constexpr int L = B / static_cast<int>(sizeof(T));
  typedef T V __attribute__((vector_size(B)));
  typedef I M __attribute__((vector_size(B)));
  static M lane_index() {
    M m{};
    for (int l = 0; l < L; ++l) m[l] = static_cast<I>(l);
    return m;
  }
  static V splat(T v) { return V{} + v; }
  static V load(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(T* p, V v) { std::memcpy(p, &v, sizeof v); }
  // mask ? b : a, lane by lane (mask lanes are all ones or all zeros).
  static V blend(V a, V b, M mask) {
    return reinterpret_cast<V>((reinterpret_cast<M>(a) & ~mask) | (reinterpret_cast<M>(b) & mask));
  }
};

// Vector bytes for rows of N elements of T: one 16-byte vector when that holds a row, else the
// widest the variant allows.
template <class T, int N>
constexpr int row_vec_bytes() {
  return (N * static_cast<int>(sizeof(T)) <= 16 || OPBRIDGE_INVERSE_MAX_VEC_BYTES < 32) ? 16 : 32;
}

// Gauss-Jordan inversion of G independent N x N matrices (a and out hold G consecutive
// matrices). Everything is unrolled over the compile-time sizes so that the matrices live in
// registers as rows of R vectors (lanes past column N-1 are zero and stay zero); the only
// runtime index is the pivot row p, applied with lane masks instead of addressing, because a
// runtime row address would force the matrices to memory. Column k is likewise cleared with a
// mask, never with a scalar store: a scalar store followed by a vector load of the same row
// stalls store-to-load forwarding. The G inversions are interleaved step by step: one
// inversion is a chain of dependent operations (pivot search, division, row updates, next
// pivot search), and interleaving gives the CPU independent work.
// Returns kOk, or the step k at which one of the G matrices has a zero pivot (`out` is then
// unspecified).
template <class T, int N, int G>
int invert_fixed(const T* __restrict a, T* __restrict out) {
  using S = Simd<T, row_vec_bytes<T, N>()>;
  using V = typename S::V;
  using M = typename S::M;
  using I = typename S::I;
  constexpr int L = S::L;
  constexpr int R = (N + L - 1) / L;
  V m[G][N][R];
#pragma GCC unroll 64
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 16
    for (int i = 0; i < N; ++i) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        V v = {};
#pragma GCC unroll 8
        for (int l = 0; l < L; ++l) v[l] = r * L + l < N ? a[(g * N + i) * N + r * L + l] : T(0);
        m[g][i][r] = v;
      }
    }
  }
  const V one = S::splat(T(1));
  const M lanes = S::lane_index();
  int piv[G][N];
#pragma GCC unroll 16
  for (int k = 0; k < N; ++k) {
    const int rk = k / L, lk = k % L;
    M is_k[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) is_k[r] = (lanes + static_cast<I>(r * L)) == static_cast<I>(k);
    int failed = kOk;
#pragma GCC unroll 64
    for (int g = 0; g < G; ++g) {
      // Pivot search on the magnitudes of column k, rows k..N-1 (as pivot_in_column).
      int p = k;
      auto best = magnitude_key(m[g][k][rk][lk]);
#pragma GCC unroll 16
      for (int i = k + 1; i < N; ++i) {
        const auto v = magnitude_key(m[g][i][rk][lk]);
        const bool take = v > best;
        p = take ? i : p;
        best = take ? v : best;
      }
      piv[g][k] = p;
      // Interchange rows k and p through masks (sel is all ones for i == p): q takes row p,
      // row p takes row k.
      V q[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) q[r] = m[g][k][r];
#pragma GCC unroll 16
      for (int i = k + 1; i < N; ++i) {
        const M sel = M{} - static_cast<I>(i == p);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const V row_i = m[g][i][r];
          q[r] = S::blend(q[r], row_i, sel);
          m[g][i][r] = S::blend(row_i, m[g][k][r], sel);
        }
      }
      const T pivot = q[rk][lk];
      failed = (failed == kOk && pivot == T(0)) ? k : failed;
      // q[k] = 1, so that the update leaves -l_i in column k.
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) q[r] = S::blend(q[r], one, is_k[r]);
      // Every row, the pivot row too (keeps the loop branch-free; it is overwritten below).
#pragma GCC unroll 16
      for (int i = 0; i < N; ++i) {
        const T l = m[g][i][rk][lk] / pivot;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) m[g][i][r] = S::blend(m[g][i][r], V{}, is_k[r]) - l * q[r];
      }
      const T d = T(1) / pivot;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) m[g][k][r] = q[r] * d;
    }
    if (failed != kOk) return failed;
  }
  // Store, undoing the interchanges through a memory copy: the column order is only known at
  // run time.
#pragma GCC unroll 64
  for (int g = 0; g < G; ++g) {
    int c[N];
    column_order(piv[g], c, N);
    alignas(32) T buf[N][R * L];
#pragma GCC unroll 16
    for (int i = 0; i < N; ++i) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) S::store(&buf[i][r * L], m[g][i][r]);
    }
    for (int i = 0; i < N; ++i) {
      for (int j = 0; j < N; ++j) out[(g * N + i) * N + j] = buf[i][c[j]];
    }
  }
  return kOk;
}

// Vectors of the widest size the variant allows, for the runtime-size kernels.
template <class T>
using Wide = Simd<T, OPBRIDGE_INVERSE_MAX_VEC_BYTES>;

// One register tile of sub_products: MR rows x U vectors of columns, all nt terms.
template <class T, int MR, int U>
inline void sub_products_tile(T* __restrict dst, int64_t ld, const T* __restrict f, int64_t fr, int64_t ft,
                              const T* __restrict P, int64_t ldp, int nt) {
  using S = Wide<T>;
  using V = typename S::V;
  constexpr int L = S::L;
  V acc[MR][U];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) acc[r][u] = S::load(dst + r * ld + u * L);
  }
  for (int t = 0; t < nt; ++t) {
    V pv[U];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) pv[u] = S::load(P + t * ldp + u * L);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const V fv = S::splat(f[r * fr + t * ft]);
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) acc[r][u] -= fv * pv[u];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) S::store(dst + r * ld + u * L, acc[r][u]);
  }
}

// For MR rows r (row stride ld) and columns j in [0, len):
//   dst[r][j] -= sum_{t < nt} f[r * fr + t * ft] * P[t * ldp + j],
// each element's terms subtracted one at a time in the order t = 0, 1, ..., whatever the
// tiling, so that equal rows with equal multipliers always get bit-identical results (see
// invert_panel). Tiles of MR x U vectors give the CPU MR * U independent multiply-add chains
// (8: two pipes with 4-cycle latency) and read each dst element once for all nt terms.
template <class T, int MR>
inline void sub_products(T* __restrict dst, int64_t ld, const T* __restrict f, int64_t fr, int64_t ft,
                         const T* __restrict P, int64_t ldp, int nt, int64_t len) {
  constexpr int L = Wide<T>::L;
  constexpr int U = MR >= 4 ? 2 : 8;
  int64_t j = 0;
  for (; j + U * L <= len; j += U * L) sub_products_tile<T, MR, U>(dst + j, ld, f, fr, ft, P + j, ldp, nt);
  for (; j + L <= len; j += L) sub_products_tile<T, MR, 1>(dst + j, ld, f, fr, ft, P + j, ldp, nt);
  for (; j < len; ++j) {
    for (int r = 0; r < MR; ++r) {
      T acc = dst[r * ld + j];
      for (int t = 0; t < nt; ++t) acc -= f[r * fr + t * ft] * P[t * ldp + j];
      dst[r * ld + j] = acc;
    }
  }
}

// Panel width of invert_panel: matrices up to this size are one panel (no deferred updates);
// larger ones are processed in panels of kBlock columns (about as fast at n = 16, faster
// beyond).
constexpr int kSinglePanelMax = 16;
// Columns per panel of a larger matrix. The deferred update reads and writes each row once per
// panel instead of once per column, so memory traffic drops by this factor; but the panel's
// own updates grow with it (n x kBlock per step). 8 (one AVX2 vector of f32) measured fastest
// for n = 24..256 among 4..32; sizes that are not a multiple of the vector width are much
// slower. The AVX-512 copy (used for n >= 128) takes 16, one vector of its width: 1.45x
// faster than 8 with it at n = 256.
constexpr int kBlock = OPBRIDGE_INVERSE_MAX_VEC_BYTES >= 64 ? 16 : 8;

inline int panel_width(int n) { return n <= kSinglePanelMax ? n : kBlock; }
// Row stride of the pivot-row buffer P: padded so that its rows do not share 4 KiB offsets
// with the rows of m, which would make the CPU see false store-to-load dependences.
inline int64_t pivot_rows_ld(int n) { return n + 16; }
// Scratch of invert_panel for size n, in elements of T.
inline size_t panel_scratch(int n) {
  const size_t w = static_cast<size_t>(panel_width(n)), nn = static_cast<size_t>(n);
  return 2 * w * nn + w * static_cast<size_t>(pivot_rows_ld(n)) + nn + w;
}

// pivot_in_column for a contiguous column, a vector of rows at a time: each lane keeps the
// first row of its largest key, and the first row among the lanes holding the overall largest
// key is the answer (as the scalar search's).
template <class T>
inline int pivot_in_column_wide(const T* col, int k, int n) {
  using S = Wide<T>;
  using M = typename S::M;
  using I = typename S::I;
  constexpr int L = S::L;
  if (n - k < 2 * L) return pivot_in_column(col, k, n);
  const M sign_off = M{} + static_cast<I>(std::numeric_limits<I>::max());  // clears the sign bit
  M best = reinterpret_cast<M>(S::load(col + k)) & sign_off;
  M idx = S::lane_index() + static_cast<I>(k);
  M at = idx;
  int i = k + L;
  for (; i + L <= n; i += L) {
    at += static_cast<I>(L);
    const M key = reinterpret_cast<M>(S::load(col + i)) & sign_off;
    const M gt = key > best;
    best = gt ? key : best;
    idx = gt ? at : idx;
  }
  I top = best[0];
  for (int l = 1; l < L; ++l) top = std::max(top, best[l]);
  int p = n;
  for (int l = 0; l < L; ++l) p = best[l] == top ? std::min(p, static_cast<int>(idx[l])) : p;
  // The rows left over, scalar.
  for (; i < n; ++i) {
    const I v = static_cast<I>(magnitude_key(col[i]));
    if (v > top) {
      top = v;
      p = i;
    }
  }
  return p;
}

// Gauss-Jordan inversion in place in `m` (n x n, row-major), any n, the columns processed in
// panels [k0, k1) of panel_width(n):
//   - the panel is copied into `pan` column by column (column j of the panel contiguous), so
//     that pivot search, multipliers (one vector division per 4-8 rows) and updates are
//     contiguous vector loops over rows, in L1;
//   - each step updates the panel columns of every row at once; outside the panel, the
//     multiplier of row i at step s is kept in F[s][i] (zero once applied);
//   - the pivot row of step s first gets its pending updates outside the panel (the
//     multipliers of the panel's earlier steps) and is then kept, unscaled, in P[s];
//   - after the panel, every row gets its pending updates outside it at once:
//     m[i][j] -= sum_s F[s][i] * P[s][j], a small matrix product (sub_products) that reads and
//     writes each row once per panel instead of once per column.
// The pending updates of a row are applied in step order in both places, so equal rows stay
// bit-identical and a row equal to the pivot row is still eliminated exactly.
// `scratch` holds panel_scratch(n) elements; piv holds 2n ints. Returns kOk or the step with a
// zero pivot.
template <class T>
int invert_panel(T* m, int n, T* __restrict scratch, int* piv) {
  const int64_t ld = n;
  const int w = panel_width(n);
  const int64_t ldp = pivot_rows_ld(n);
  T* __restrict pan = scratch;            // w x n: pan[j * n + i] = row i, column k0 + j
  T* __restrict F = pan + int64_t{w} * n;  // w x n: F[s * n + i] = pending multiplier
  T* __restrict P = F + int64_t{w} * n;    // w x ldp: unscaled pivot rows (outside the panel)
  T* __restrict l = P + w * ldp;           // n: multipliers of the current step
  T* __restrict pp = l + n;                // w: the pivot row's panel values
  for (int k0 = 0; k0 < n; k0 += w) {
    const int nb = std::min(w, n - k0);
    const int k1 = k0 + nb;
    const bool outside = nb < n;  // columns outside the panel exist
    for (int64_t i = 0; i < n; ++i) {
      for (int j = 0; j < nb; ++j) pan[j * ld + i] = m[i * ld + k0 + j];
    }
    if (outside) std::fill(F, F + int64_t{nb} * n, T(0));
    for (int s = 0; s < nb; ++s) {
      const int k = k0 + s;
      T* __restrict colk = pan + s * ld;
      const int p = pivot_in_column_wide(colk, k, n);
      const T pivot = colk[p];
      if (pivot == T(0)) return k;
      piv[k] = p;
      T* rk = m + k * ld;
      if (p != k) {
        for (int j = 0; j < nb; ++j) std::swap(pan[j * ld + k], pan[j * ld + p]);
        if (outside) {
          std::swap_ranges(rk, rk + n, m + p * ld);
          for (int t = 0; t < nb; ++t) std::swap(F[t * ld + k], F[t * ld + p]);
        }
      }
      T* ps = P + s * ldp;
      if (outside) {
        // The pivot row outside the panel, brought up to date with the panel's earlier steps.
        sub_products<T, 1>(rk, 0, F + k, 0, ld, P, ldp, s, k0);
        sub_products<T, 1>(rk + k1, 0, F + k, 0, ld, P + k1, ldp, s, n - k1);
        for (int t = 0; t < s; ++t) F[t * ld + k] = T(0);
        std::copy(rk, rk + k0, ps);
        std::copy(rk + k1, rk + n, ps + k1);
      }
      for (int i = 0; i < n; ++i) l[i] = colk[i] / pivot;
      for (int j = 0; j < nb; ++j) pp[j] = pan[j * ld + k];
      for (int j = 0; j < nb; ++j) {
        if (j == s) continue;
        T* __restrict cj = pan + j * ld;
        const T pj = pp[j];
        for (int i = 0; i < n; ++i) cj[i] -= l[i] * pj;
      }
      for (int i = 0; i < n; ++i) colk[i] = -l[i];
      if (outside) {
        std::copy(l, l + n, F + s * ld);
        F[s * ld + k] = T(0);
      }
      // The pivot row: scaled by 1/pivot, with 1/pivot in column k.
      const T d = T(1) / pivot;
      for (int j = 0; j < nb; ++j) pan[j * ld + k] = pp[j] * d;
      colk[k] = d;
      if (outside) {
        for (int j = 0; j < k0; ++j) rk[j] = ps[j] * d;
        for (int j = k1; j < n; ++j) rk[j] = ps[j] * d;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int j = 0; j < nb; ++j) m[i * ld + k0 + j] = pan[j * ld + i];
    }
    if (outside) {
      // The deferred updates outside the panel: m[:, rest] -= F^T * P[:, rest], 4 rows at a
      // time (each P load then serves 4 rows).
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) {
        sub_products<T, 4>(m + i * ld, ld, F + i, 1, ld, P, ldp, nb, k0);
        sub_products<T, 4>(m + i * ld + k1, ld, F + i, 1, ld, P + k1, ldp, nb, n - k1);
      }
      for (; i < n; ++i) {
        sub_products<T, 1>(m + i * ld, 0, F + i, 0, ld, P, ldp, nb, k0);
        sub_products<T, 1>(m + i * ld + k1, 0, F + i, 0, ld, P + k1, ldp, nb, n - k1);
      }
    }
  }
  unscramble_columns(m, n, piv, l, piv + n);
  return kOk;
}

#if OPBRIDGE_INVERSE_MAX_VEC_BYTES >= 32
// AVX2 kernel for f32 matrices of size N <= 8, held by columns: one 8-lane vector per column,
// lane i = row i (an N x N matrix is padded to 8 x 8 with the identity, whose rows never win a
// pivot search and whose columns no step changes). AVX2's lane permutes make every part of a
// pivot step a vector operation: the pivot search is a vector max plus a mask scan, the row
// interchange one permute per column, the multipliers one division, and each column's update
// one multiply-add. The rows of A are loaded and transposed once, and transposed back at the
// end. Same arithmetic and result as invert_fixed; G matrices are interleaved step by step (2
// spill a few registers but still run ~1.7x faster than 1, whose steps are latency-bound).
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

template <int N, int G>
int invert_cols8_f32(const float* __restrict a, float* __restrict out) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i row_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(N), iota);  // lanes < N
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256 one = _mm256_set1_ps(1.0f);
  // Padding lanes (rows >= N) must never win the pivot search: they start at 0, but an inf or
  // NaN pivot turns them into NaN (0 / NaN, 0 * inf), which outranks every key, and a pivot
  // row >= N then indexed past piv / order (found by fuzzing with ASan).
  const __m256i padding = _mm256_xor_si256(row_mask, _mm256_set1_epi32(-1));
  __m256 c[G][8];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      if (i >= N) {
        c[g][i] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpeq_epi32(iota, _mm256_set1_epi32(i)),
                                                       _mm256_castps_si256(one)));
      } else if (N == 8) {
        c[g][i] = _mm256_loadu_ps(a + (g * N + i) * N);
      } else {
        c[g][i] = _mm256_maskload_ps(a + (g * N + i) * N, row_mask);
      }
    }
    transpose8(c[g]);
  }
  int piv[G][N];
  int failed = kOk;
#pragma GCC unroll 8
  for (int k = 0; k < N; ++k) {
    // Lanes that may not be the pivot: rows already eliminated (< k) and padding (>= N).
    const __m256i done = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(k), iota), padding);
    const __m256i lane_k = _mm256_set1_epi32(k);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      // Pivot search: the largest |c[k][i]| for k <= i < N as integer keys (NaN above inf; the
      // other lanes get the sign bit, i.e. negative keys), the first lane on ties.
      const __m256i key = _mm256_or_si256(_mm256_castps_si256(_mm256_and_ps(c[g][k], abs_mask)),
                                          _mm256_and_si256(done, _mm256_castps_si256(sign)));
      __m256i mx = _mm256_max_epi32(key, _mm256_permute2x128_si256(key, key, 0x01));
      mx = _mm256_max_epi32(mx, _mm256_shuffle_epi32(mx, 0x4E));
      mx = _mm256_max_epi32(mx, _mm256_shuffle_epi32(mx, 0xB1));
      const int p = __builtin_ctz(
          static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(key, mx)))));
      piv[g][k] = p;
      // Interchange rows (lanes) k and p in every column.
      const __m256i swap = _mm256_add_epi32(
          iota, _mm256_add_epi32(_mm256_and_si256(_mm256_cmpeq_epi32(iota, lane_k), _mm256_set1_epi32(p - k)),
                                 _mm256_and_si256(_mm256_cmpeq_epi32(iota, _mm256_set1_epi32(p)),
                                                  _mm256_set1_epi32(k - p))));
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) c[g][j] = _mm256_permutevar8x32_ps(c[g][j], swap);
      const __m256 pivot = _mm256_permutevar8x32_ps(c[g][k], lane_k);
      // Checked once per step for the group: a branch per matrix would split the unrolled code.
      failed = (failed == kOk && _mm256_cvtss_f32(pivot) == 0.0f) ? k : failed;
      // Multipliers l_i = c[k][i] / pivot (lane k: exactly 1) and d = 1 / pivot.
      const __m256 l = _mm256_div_ps(c[g][k], pivot);
      const __m256 d = _mm256_div_ps(one, pivot);
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) {
        if (j == k) continue;
        // Row k's entry of column j, in every lane; lane k of the update is exactly 0 and
        // becomes that entry times d.
        const __m256 rj = _mm256_permutevar8x32_ps(c[g][j], lane_k);
        c[g][j] = _mm256_blend_ps(_mm256_fnmadd_ps(l, rj, c[g][j]), _mm256_mul_ps(rj, d), 1 << k);
      }
      c[g][k] = _mm256_blend_ps(_mm256_xor_ps(l, sign), d, 1 << k);
    }
    if (failed != kOk) return failed;
  }
  // Undo the interchanges by reordering the columns, then back to rows.
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    int order[N];
    column_order(piv[g], order, N);
    __m256 r[8];
    for (int j = 0; j < N; ++j) r[j] = c[g][order[j]];
    for (int j = N; j < 8; ++j) r[j] = c[g][j];
    transpose8(r);
    float* o = out + g * N * N;
    if (N == 8) {
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(o + i * 8, r[i]);
    } else {
      // Full-width stores run into the next row, which is written afterwards; the last row
      // must not pass the end of the matrix.
      for (int i = 0; i + 1 < N; ++i) _mm256_storeu_ps(o + i * N, r[i]);
      _mm256_maskstore_ps(o + (N - 1) * N, row_mask, r[N - 1]);
    }
  }
  return kOk;
}
#endif

// Matrices interleaved by the fixed-size kernel (see invert_fixed): 2 fills the gaps in one
// inversion's dependency chain; more only adds register pressure.
constexpr int kGroup = 2;

// Inverts matrices [begin, end) of the batch with the fixed-size kernel; returns the first
// failure as (batch index, step), or (-1, kOk).
template <class T, int N>
Failure run_fixed(const T* a, T* out, int64_t begin, int64_t end) {
  constexpr int64_t kSize = int64_t{N} * N;
  int64_t b = begin;
  if constexpr (N == 2 && std::is_same_v<T, float>) {
    for (; b < end; ++b) {
      const int k = invert_2x2_f32(a + b * kSize, out + b * kSize);
      if (k != kOk) return {b, k};
    }
    return {-1, kOk};
  } else {
    // The kernel for G matrices at a time.
    auto kernel = [](auto group, const T* x, T* y) {
#if OPBRIDGE_INVERSE_MAX_VEC_BYTES >= 32
      if constexpr (std::is_same_v<T, float> && N >= 5) {
        return invert_cols8_f32<N, decltype(group)::value>(x, y);
      } else  // (so that the other kernel is not even instantiated)
#endif
      {
        return invert_fixed<T, N, decltype(group)::value>(x, y);
      }
    };
    for (; b + kGroup <= end; b += kGroup) {
      // On a failure, redo the group one matrix at a time to find the first failing one.
      if (kernel(std::integral_constant<int, kGroup>{}, a + b * kSize, out + b * kSize) != kOk) break;
    }
    for (; b < end; ++b) {
      const int k = kernel(std::integral_constant<int, 1>{}, a + b * kSize, out + b * kSize);
      if (k != kOk) return {b, k};
    }
    return {-1, kOk};
  }
}

template <class T>
Failure run_dynamic(const T* a, T* out, int64_t begin, int64_t end, int n) {
  const int64_t size = static_cast<int64_t>(n) * n;
  // Scratch, allocated once per task (never per matrix).
  std::vector<T> scratch(panel_scratch(n));
  std::vector<int> piv(2 * static_cast<size_t>(n));
  for (int64_t b = begin; b < end; ++b) {
    T* m = out + b * size;
    if (m != a + b * size) std::copy(a + b * size, a + (b + 1) * size, m);
    const int k = invert_panel(m, n, scratch.data(), piv.data());
    if (k != kOk) return {b, k};
  }
  return {-1, kOk};
}

template <class T>
Failure run_range(const T* a, T* out, int64_t begin, int64_t end, int64_t n) {
  switch (n) {
    case 1: return run_1x1(a, out, begin, end);
    case 2: return run_fixed<T, 2>(a, out, begin, end);
    case 3: return run_fixed<T, 3>(a, out, begin, end);
    case 4: return run_fixed<T, 4>(a, out, begin, end);
    case 5: return run_fixed<T, 5>(a, out, begin, end);
    case 6: return run_fixed<T, 6>(a, out, begin, end);
    case 7: return run_fixed<T, 7>(a, out, begin, end);
    case 8: return run_fixed<T, 8>(a, out, begin, end);
    default: return run_dynamic(a, out, begin, end, static_cast<int>(n));
  }
}

}  // namespace

// The x86-64 variants' entry points (inverse_cpu_isa.cpp; the baseline calls run_range itself):
// each inverts matrices [begin, end) of the batch (n x n each) and returns the first failure,
// run_avx2 as run_range, run_avx512 with the runtime-size kernel only.
template <class T> Failure run_avx2(const T* a, T* out, int64_t begin, int64_t end, int64_t n);
template <class T> Failure run_avx512(const T* a, T* out, int64_t begin, int64_t end, int64_t n);

}  // namespace opbridge::inverse_impl
