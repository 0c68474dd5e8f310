// Inverse CPU kernel: framework-free, shared by the torch op, the ORT op and opbridge._core.
//
// Every size uses elimination with partial pivoting, so that "singular" means what it means
// for LAPACK and torch (an exactly zero pivot U[k,k]); only n <= 2 use closed forms, where the
// determinant test is at least as exact:
//   n == 1        1 / a.
//   n == 2, f32   adjugate / determinant evaluated in double: products of two floats are exact
//                 in double, so det == 0 exactly when the matrix is singular, and the result is
//                 rounded once. (f64 takes the pivoted path, which cannot overflow or underflow
//                 in a determinant.)
//   n <= 8        Gauss-Jordan on matrices held in registers, fully unrolled for each size
//                 (invert_fixed; with AVX2, f32 n >= 5 holds columns in 8-lane vectors:
//                 invert_cols8_f32).
//   n > 8         Gauss-Jordan on column panels (invert_panel): one panel up to n = 16; beyond,
//                 panels of 8 columns whose updates to the rest of the matrix are deferred into
//                 a small matrix product, so each row is read once per 8 pivot steps.
// Gauss-Jordan picks the pivots of LU with partial pivoting (the rows below the diagonal see the
// same eliminations), costs n^3 multiply-adds like an LU-based inverse, and needs no memory
// besides the output and O(n^2) (n <= 16) or O(8 n) scratch per task. The shared
// arithmetic is described at the top of inverse_kernels.inc.
//
// The kernels are compiled twice on x86-64 (SSE2 baseline, AVX2 + FMA) from
// inverse_kernels.inc, and inverse_cpu picks one at run time; the runtime-size kernel is
// compiled a third time for AVX-512, used for n >= kAvx512MinN.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "inverse.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace opbridge {

namespace inverse_impl {
namespace {

// A kernel's result: kOk, or the step k at which the pivot U[k,k] is zero.
constexpr int kOk = -1;

// The first failure in a range of the batch: its batch index and step, or {-1, kOk}.
struct Failure {
  int64_t index;
  int step;
};

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

}  // namespace

// The kernels for the architecture's baseline.
namespace baseline {
namespace {
#define OPBRIDGE_INVERSE_MAX_VEC_BYTES 16
#include "inverse_kernels.inc"
#undef OPBRIDGE_INVERSE_MAX_VEC_BYTES
}  // namespace
}  // namespace baseline

// The kernels again, compiled for AVX2 + FMA (x86-64 only, chosen at run time): 32-byte rows
// and fused multiply-adds roughly double the throughput of the arithmetic.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define OPBRIDGE_INVERSE_HAS_AVX2 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace avx2 {
namespace {
#define OPBRIDGE_INVERSE_MAX_VEC_BYTES 32
#include "inverse_kernels.inc"
#undef OPBRIDGE_INVERSE_MAX_VEC_BYTES
}  // namespace
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

// The runtime-size kernel once more with AVX-512 (64-byte vectors, panels of 16 columns), for
// large matrices only (kAvx512MinN): only run_dynamic is instantiated from this copy, so the
// unrolled fixed-size kernels are not compiled a third time.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define OPBRIDGE_INVERSE_HAS_AVX512 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")
#endif
namespace avx512 {
namespace {
#define OPBRIDGE_INVERSE_MAX_VEC_BYTES 64
#include "inverse_kernels.inc"
#undef OPBRIDGE_INVERSE_MAX_VEC_BYTES
}  // namespace
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

}  // namespace inverse_impl

namespace {

// Multiply-adds per parallel task: ~2^15 keeps a task around 10-30 us, long enough to amortize
// the pool's dispatch cost (a few us) yet short enough to balance a batch over the threads.
constexpr int64_t kMinTaskWork = int64_t{1} << 15;
// From this size on the AVX-512 variant runs the AVX-512 kernel. Measured against the AVX2 one
// (1 thread, this machine's Zen 5): 0.8-0.9x at n = 32-64 (16-lane vectors leave the panel
// updates of small matrices mostly remainders), 1.04x at 128, 1.2-1.3x at 192-256, 1.4x at 512.
constexpr int64_t kAvx512MinN = 128;

}  // namespace

template <class T>
Status inverse_cpu(const T* a, T* out, int64_t batch, int64_t n, const ParallelFor& pf, CpuIsa isa,
                   bool nan_on_singular) {
  using inverse_impl::Failure;
  if (!cpu_isa_supported(isa)) {
    return Status::NotImplemented(std::string("the ") + cpu_isa_name(isa) +
                                  " kernels are not available on this CPU or in this build");
  }
  if (batch <= 0 || n <= 0) return Status::Ok();
  if (n > std::numeric_limits<int>::max() / 2) {
    return Status::InvalidArgument("matrix size n = " + std::to_string(n) + " is too large");
  }
  Failure (*run)(const T*, T*, int64_t, int64_t, int64_t) = &inverse_impl::baseline::run_range<T>;
#ifdef OPBRIDGE_INVERSE_HAS_AVX2
  // kAvx512 runs the AVX2 kernels too, except for large matrices (below).
  if (static_cast<int>(cpu_isa_resolve(isa)) >= static_cast<int>(CpuIsa::kAvx2)) run = &inverse_impl::avx2::run_range<T>;
#endif
#ifdef OPBRIDGE_INVERSE_HAS_AVX512
  if (cpu_isa_resolve(isa) == CpuIsa::kAvx512 && n >= kAvx512MinN) {
    run = [](const T* x, T* y, int64_t b, int64_t e, int64_t m) {
      return inverse_impl::avx512::run_dynamic<T>(x, y, b, e, static_cast<int>(m));
    };
  }
#endif
  // The first failure over the whole batch: each task stops at its own first failure, and the
  // smallest batch index among those is the first overall, whatever the task split.
  std::mutex mu;
  Failure first{std::numeric_limits<int64_t>::max(), -1};
  // + 16: the per-matrix overhead that dominates tiny sizes, in the same units.
  const int64_t work = n * n * n + 16;
  const int64_t grain = std::max<int64_t>(1, kMinTaskWork / work);
  const int64_t size = n * n;
  pf(batch, grain, [&](int64_t begin, int64_t end) {
    // Every kernel stops at the first singular matrix of its range and reports it; with
    // nan_on_singular that matrix becomes NaN and the kernel goes on after it, so one code path
    // serves every size and instruction set. (Its output may hold partial work, in place too:
    // it is overwritten whole.)
    while (begin < end) {
      const Failure f = run(a, out, begin, end, n);
      if (f.index < 0) return;
      if (!nan_on_singular) {
        std::lock_guard<std::mutex> lock(mu);
        if (f.index < first.index) first = f;
        return;
      }
      std::fill(out + f.index * size, out + (f.index + 1) * size, std::numeric_limits<T>::quiet_NaN());
      begin = f.index + 1;
    }
  });
  if (first.step >= 0) {
    return Status::LinAlgError("matrix " + std::to_string(first.index) + " of the batch is singular (U[" +
                                std::to_string(first.step) + "," + std::to_string(first.step) + "] == 0)");
  }
  return Status::Ok();
}

template Status inverse_cpu<float>(const float*, float*, int64_t, int64_t, const ParallelFor&, CpuIsa, bool);
template Status inverse_cpu<double>(const double*, double*, int64_t, int64_t, const ParallelFor&, CpuIsa, bool);

// ---- the compute function (opbridge/kernel.h) --------------------------------------------------

namespace {

Status compute(const KernelCall& k) {
  const InverseParams p = inverse_params(k);
  return dispatch<float, double>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    return inverse_cpu<T>(k.in<T>("x"), k.out<T>(0), p.d.batch, p.d.n, k.parallel(), k.isa(), p.nan_on_singular);
  });
}

}  // namespace

OPBRIDGE_KERNEL(inverse_decl, kCpu, compute);

}  // namespace opbridge
