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
// arithmetic is described at the top of inverse_isa.h.
//
// The kernels (inverse_isa.h) are compiled here for the baseline and, on x86-64, for AVX2 + FMA
// (inverse_cpu_isa.cpp), and inverse_cpu picks one at run time; the runtime-size kernel is
// compiled a third time for AVX-512, used for n >= kAvx512MinN.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "inverse.h"
#include "inverse_isa.h"

namespace opbridge {

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
  OPBRIDGE_RETURN_IF_ERROR(cpu_isa_check(isa));
  if (batch <= 0 || n <= 0) return Status::Ok();
  if (n > std::numeric_limits<int>::max() / 2) {
    return Status::InvalidArgument("matrix size n = " + std::to_string(n) + " is too large");
  }
  Failure (*run)(const T*, T*, int64_t, int64_t, int64_t) = &inverse_impl::run_range<T>;
#if defined(OPBRIDGE_X86_DISPATCH)
  // kAvx512 runs the AVX2 kernels too, except for large matrices (below).
  if (static_cast<int>(cpu_isa_resolve(isa)) >= static_cast<int>(CpuIsa::kAvx2)) run = &inverse_impl::run_avx2<T>;
  if (cpu_isa_resolve(isa) == CpuIsa::kAvx512 && n >= kAvx512MinN) run = &inverse_impl::run_avx512<T>;
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
