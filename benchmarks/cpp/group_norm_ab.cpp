// Two versions of GroupNorm's kernels (ops/group_norm/group_norm_simd.h and
// group_norm_backward_simd.h, AVX2 or AVX-512), side by side in one process: a change's effect on speed
// measured where the host's drift hits both alike. Per shape, rounds alternate
//   copy   x into y with ordinary vector stores (floor_schedules.h: copy_stores), the unit;
//   A, B   the two kernels, in alternating order, then the copy again (the faster copy of the
//          round is its unit);
//   read   a plain sum of x, and `scale`, y = x * a + b with ordinary stores: what the kernel's
//          passes cost before any arithmetic;
// and prints the medians of the per-round ratios to the copy and of B / A. Every side writes the
// same y, the one the copy writes: a side writing a buffer of its own ran 5-21% slower than the
// same code writing the copy's (that buffer was in no cache). --fresh gives B a newly allocated y on
// every call instead (as a torch op's output is). --backward times the backward instead (dy drawn
// as x; the kernel writes dx into y and the per-channel sums; reading x and dy and writing dx is
// 1.5 copies' traffic). A and B run once on the same input first and their outputs (the
// backward's: dx, the sums and rstd) are compared bit for bit: the exit status is 1 where they
// differ (a change meant to keep the results), 2 on bad arguments.
//
// Build and run with group_norm_ab.sh (A: a git revision's headers or a folder holding them, B: the
// working tree's). The environment's GN_AB_B_STREAM_BYTES, GN_AB_B_CACHE_BUDGET, GN_AB_B_WAVE_BYTES
// (bytes, K/M suffixes) and GN_AB_B_FUSE (0 or 1) give B's kernels another streaming threshold,
// cache budget (both the plain and the streamed one, as OPBRIDGE_GROUP_NORM_CACHE_BUDGET sets
// them), channels-last wave size or fused-pass choice than A's, so that the same headers on both
// sides compare two settings of a cache choice in one process. Options: --rounds R (21), --groups G (32), --nchw (contiguous [N, C, H, W];
// default channels-last), --silu, --fresh, --backward; then shapes N,C,H,W. The cache choices are
// the installed library's (group_norm_cpu_choices(): what the OS reports, and the environment's
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
void gn_ab_bwd_a(const group_norm_isa::BackwardArgs<float>& a, const ParallelFor& pf);
void gn_ab_bwd_b(const group_norm_isa::BackwardArgs<float>& a, const ParallelFor& pf);
}  // namespace opbridge

using opbridge::ParallelFor;
using omp_parallel_for::median;
using omp_parallel_for::omp_runner;

namespace {
// A byte count from the environment: -1 where unset, -2 where not a count (digits, then K or M).
int64_t env_bytes(const char* name) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return -1;
  char* end = nullptr;
  const long long n = std::strtoll(s, &end, 10);
  if (end == s || n < 0) return -2;
  const int64_t mult = *end == 'K' ? 1024 : *end == 'M' ? 1024 * 1024 : 1;
  if (*end != '\0' && (mult == 1 || end[1] != '\0')) return -2;
  return static_cast<int64_t>(n) * mult;
}
}  // namespace

int main(int argc, char** argv) {
  gn_bench::Options opt;
  opt.rounds = 21;
  if (!gn_bench::parse(argc, argv, {"--nchw", "--fresh", "--backward"}, &opt)) return 2;
  const int rounds = opt.rounds;
  const int64_t groups = opt.groups;
  const bool silu = opt.silu, channels_last = !opt.nchw, fresh = opt.fresh, backward = opt.backward;
  gn_bench::keep_freed_memory();
  const opbridge::GroupNormCpuChoices& ch = opbridge::group_norm_cpu_choices();
  const ParallelFor pf(omp_runner, nullptr);
  const int64_t b_stream_bytes = env_bytes("GN_AB_B_STREAM_BYTES");
  const int64_t b_budget = env_bytes("GN_AB_B_CACHE_BUDGET");
  const int64_t b_wave_bytes = env_bytes("GN_AB_B_WAVE_BYTES");
  const int b_fuse = env_bytes("GN_AB_B_FUSE") < 0 ? -1 : static_cast<int>(env_bytes("GN_AB_B_FUSE"));
  if (b_stream_bytes == -2 || b_budget == -2 || b_budget == 0 || b_wave_bytes == -2 || b_fuse == -2 || b_fuse > 1) {
    std::fprintf(stderr,
                 "GN_AB_B_STREAM_BYTES and GN_AB_B_WAVE_BYTES must be byte counts (K/M suffixes), "
                 "GN_AB_B_CACHE_BUDGET one above 0, GN_AB_B_FUSE 0 or 1\n");
    return 2;
  }
#if defined(__AVX512F__)
  const char* isa = "AVX-512";
#else
  const char* isa = "AVX2";
#endif
  std::printf("%s, %d threads; G = %lld; %s%s%s; %d rounds; medians of time / a copy's\n", isa, omp_get_max_threads(),
              static_cast<long long>(groups), backward ? "backward, " : "", channels_last ? "channels-last" : "contiguous",
              silu ? " + SiLU" : "", rounds);
  if (b_stream_bytes >= 0 || b_budget > 0 || b_wave_bytes >= 0 || b_fuse >= 0) {
    std::printf("B: stream_bytes %lld, cache_budget %lld (streamed %lld), wave_bytes %lld, fuse_groups %d "
                "(A: %lld, %lld (%lld), %lld, %d)\n",
                static_cast<long long>(b_stream_bytes >= 0 ? b_stream_bytes : ch.stream_bytes),
                static_cast<long long>(b_budget > 0 ? b_budget : ch.cache_budget),
                static_cast<long long>(b_budget > 0 ? b_budget : ch.cache_budget_streamed),
                static_cast<long long>(b_wave_bytes >= 0 ? b_wave_bytes : ch.wave_bytes),
                b_fuse >= 0 ? b_fuse : static_cast<int>(ch.fuse_groups), static_cast<long long>(ch.stream_bytes),
                static_cast<long long>(ch.cache_budget), static_cast<long long>(ch.cache_budget_streamed),
                static_cast<long long>(ch.wave_bytes), static_cast<int>(ch.fuse_groups));
  }
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
    if (b_stream_bytes >= 0) a_b.stream_bytes = b_stream_bytes;
    if (b_budget > 0) a_b.cache_budget = a_b.cache_budget_streamed = b_budget;
    if (b_wave_bytes >= 0) a_b.wave_bytes = b_wave_bytes;
    if (b_fuse >= 0) a_b.fuse_groups = b_fuse == 1;
    a_b.y = yb;
    // The backward's: dy (drawn as x is), its sums and rstd per side; dx is written into y (yb).
    std::vector<float> dy, unused_w, unused_b;
    std::vector<double> sums[2][3];
    for (auto& side : sums) {
      for (int k = 0; k < 3; ++k) side[k].assign(static_cast<size_t>(N * (k < 2 ? C : groups)), 0.0);
    }
    if (backward) {
      dy.resize(static_cast<size_t>(n));
      gn_bench::fill_inputs(dy.data(), n, C, &unused_w, &unused_b);
      std::reverse(dy.begin(), dy.end());
    }
    opbridge::group_norm_isa::BackwardArgs<float> g{dy.data(), x,          a.weight,      a.bias,
                                                    y,         a.d,        a.eps,         a.act,
                                                    nullptr,   nullptr,    nullptr,       ch.cache_budget,
                                                    ch.stream_bytes};
    opbridge::group_norm_isa::BackwardArgs<float> g_b = g;
    if (b_stream_bytes >= 0) g_b.stream_bytes = b_stream_bytes;
    if (b_budget > 0) g_b.cache_budget = b_budget;
    const auto use_sums = [&](opbridge::group_norm_isa::BackwardArgs<float>* args, int side) {
      args->ds = sums[side][0].data();
      args->db = sums[side][1].data();
      args->rstd = sums[side][2].data();
    };
    use_sums(&g, 0);
    use_sums(&g_b, 1);
    g_b.dx = yb;
    int64_t differing = 0;
    if (backward) {
      opbridge::gn_ab_bwd_a(g, pf);
      opbridge::gn_ab_bwd_b(g_b, pf);
      for (int k = 0; k < 3; ++k) {
        for (size_t i = 0; i < sums[0][k].size(); ++i) differing += std::memcmp(&sums[0][k][i], &sums[1][k][i], 8) != 0;
      }
    } else {
      opbridge::gn_ab_a(a, pf);
      opbridge::gn_ab_b(a_b, pf);
    }
    for (int64_t i = 0; i < n; ++i) differing += std::memcmp(&y[i], &yb[i], 4) != 0;
    same = same && differing == 0;
    a_b.y = y;
    g_b.dx = y;
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
    const std::function<void()> run_a = [&] {
      if (backward) {
        opbridge::gn_ab_bwd_a(g, pf);
      } else {
        opbridge::gn_ab_a(a, pf);
      }
    };
    const std::function<void()> run_b = [&] {
      float* out = fresh ? static_cast<float*>(std::malloc(bytes)) : y;
      if (backward) {
        opbridge::group_norm_isa::BackwardArgs<float> f = g_b;
        f.dx = out;
        opbridge::gn_ab_bwd_b(f, pf);
      } else {
        opbridge::group_norm_isa::Args<float> f = a_b;
        f.y = out;
        opbridge::gn_ab_b(f, pf);
      }
      if (fresh) std::free(out);
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
