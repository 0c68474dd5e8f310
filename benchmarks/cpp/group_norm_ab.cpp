// Two versions of GroupNorm's forward kernel (ops/group_norm/group_norm_simd.h, AVX2), side by side in
// one process: a change's effect on speed measured where the host's drift hits both alike. Per
// shape, rounds alternate
//   copy   x into y with ordinary vector stores (floor_schedules.h: copy_stores), the unit;
//   A, B   the two kernels, in alternating order, then the copy again (the faster copy of the
//          round is its unit);
//   read   a plain sum of x, and `scale`, y = x * a + b with ordinary stores: what the kernel's
//          passes cost before any arithmetic;
// and prints the medians of the per-round ratios to the copy and of B / A. Every side writes the
// same y, the one the copy writes: a side writing a buffer of its own ran 5-21% slower than the
// same code writing the copy's (that buffer was in no cache). --fresh gives B a newly allocated y on
// every call instead (as a torch op's output is). A and B run once on the same input first and
// their outputs are compared bit for bit: the exit status is 1 where they differ (a change meant
// to keep the results), 2 on bad arguments.
//
// Build and run with group_norm_ab.sh (A: a git revision's header or a folder holding one, B: the
// working tree's). Options: --rounds R (21), --groups G (32), --nchw (contiguous [N, C, H, W];
// default channels-last), --silu, --fresh; then shapes N,C,H,W. The cache choices are the
// installed library's (group_norm_cpu_choices(): what the OS reports, and the environment's
// OPBRIDGE_GROUP_NORM_* overrides).
#include <omp.h>

#include "group_norm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "floor_schedules.h"
#include "group_norm_bench.h"
#include "group_norm_isa.h"
#include "omp_parallel_for.h"

namespace opbridge {
void gn_ab_a(const group_norm_isa::Args<float>& a, const ParallelFor& pf);
void gn_ab_b(const group_norm_isa::Args<float>& a, const ParallelFor& pf);
}  // namespace opbridge

using opbridge::ParallelFor;
using omp_parallel_for::median;
using omp_parallel_for::omp_runner;

int main(int argc, char** argv) {
  gn_bench::Options opt;
  opt.rounds = 21;
  if (!gn_bench::parse(argc, argv, {"--nchw", "--fresh"}, &opt)) return 2;
  const int rounds = opt.rounds;
  const int64_t groups = opt.groups;
  const bool silu = opt.silu, channels_last = !opt.nchw, fresh = opt.fresh;
  gn_bench::keep_freed_memory();
  const opbridge::GroupNormCpuChoices& ch = opbridge::group_norm_cpu_choices();
  const ParallelFor pf(omp_runner, nullptr);
  std::printf("%d threads; G = %lld; %s%s; %d rounds; medians of time / a copy's\n", omp_get_max_threads(),
              static_cast<long long>(groups), channels_last ? "channels-last" : "contiguous", silu ? " + SiLU" : "",
              rounds);
  std::printf("%-16s %8s %6s %6s %7s %7s %7s  %s\n", "N,C,H,W", "copy us", "read", "scale", "A", "B", "B/A",
              "differing");
  bool same = true;
  for (const auto& sh : opt.shapes) {
    const int64_t N = sh[0], C = sh[1], S = sh[2] * sh[3], n = N * C * S;
    const size_t bytes = static_cast<size_t>((n * 4 + 63) / 64 * 64);
    float* x = static_cast<float*>(std::aligned_alloc(64, bytes));
    float* y = static_cast<float*>(std::aligned_alloc(64, bytes));
    float* yb = static_cast<float*>(std::aligned_alloc(64, bytes));
    std::vector<float> w, b;
    gn_bench::fill_inputs(x, n, C, &w, &b);
    std::memset(y, 0, bytes);
    std::memset(yb, 0, bytes);
    const opbridge::group_norm_isa::Args<float> a = gn_bench::kernel_args(x, w, b, y, N, C, S, groups, channels_last,
                                                                          silu, ch);
    opbridge::group_norm_isa::Args<float> a_b = a;
    a_b.y = yb;
    opbridge::gn_ab_a(a, pf);
    opbridge::gn_ab_b(a_b, pf);
    int64_t differing = 0;
    for (int64_t i = 0; i < n; ++i) differing += std::memcmp(&y[i], &yb[i], 4) != 0;
    same = same && differing == 0;
    a_b.y = y;
    const std::function<void()> copy = [&] {
      pf(n, int64_t{1} << 16, [&](int64_t b0, int64_t e0) { floor_schedules::copy_stores(x + b0, y + b0, e0 - b0); });
    };
    volatile float sink = 0.f;
    const std::function<void()> read = [&] {
      pf(n, int64_t{1} << 16,
         [&](int64_t b0, int64_t e0) { sink = sink + floor_schedules::read_sum(x + b0, e0 - b0); });
    };
    const std::function<void()> scale = [&] {
      pf(n, int64_t{1} << 16,
         [&](int64_t b0, int64_t e0) { floor_schedules::scale_shift<false>(x + b0, y + b0, e0 - b0); });
    };
    const std::function<void()> run_a = [&] { opbridge::gn_ab_a(a, pf); };
    const std::function<void()> run_b = [&] {
      if (!fresh) {
        opbridge::gn_ab_b(a_b, pf);
        return;
      }
      opbridge::group_norm_isa::Args<float> f = a_b;
      f.y = static_cast<float*>(std::malloc(bytes));
      opbridge::gn_ab_b(f, pf);
      std::free(f.y);
    };
    const gn_bench::Timer timed(copy);
    for (const auto* f : {&copy, &read, &scale, &run_a, &run_b}) timed(*f);  // warm-up
    std::vector<double> r_a, r_b, r_ba, r_read, r_scale, t_c;
    for (int r = 0; r < rounds; ++r) {
      double c = timed(copy), ta = 0.0, tb = 0.0;
      if (r % 2 == 0) {
        ta = timed(run_a);
        tb = timed(run_b);
      } else {
        tb = timed(run_b);
        ta = timed(run_a);
      }
      const double tr = timed(read), ts = timed(scale);
      c = std::min(c, timed(copy));
      r_a.push_back(ta / c);
      r_b.push_back(tb / c);
      r_ba.push_back(tb / ta);
      r_read.push_back(tr / c);
      r_scale.push_back(ts / c);
      t_c.push_back(c * 1e6);
    }
    char name[64];
    std::snprintf(name, sizeof(name), "%lld,%lld,%lld,%lld", static_cast<long long>(N), static_cast<long long>(C),
                  static_cast<long long>(sh[2]), static_cast<long long>(sh[3]));
    std::printf("%-16s %8.1f %6.2f %6.2f %6.2fx %6.2fx %7.3f  %lld\n", name, median(t_c), median(r_read),
                median(r_scale), median(r_a), median(r_b), median(r_ba), static_cast<long long>(differing));
    std::fflush(stdout);
    std::free(x);
    std::free(y);
    std::free(yb);
  }
  return same ? 0 : 1;
}
