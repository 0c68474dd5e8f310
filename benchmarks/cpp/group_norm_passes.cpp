// GroupNorm's channels-last forward pass by pass, each against its own floor, side by side in one
// process (AVX2, or AVX-512 where built for it): where a sample is cut into tiles (gn_forward_nhwc's tile path, the samples larger
// than the cache budget), the kernel is a statistics pass over every tile, then a normalization
// pass, and its time over a copy's is the sum of the two. Per shape, rounds alternate
//   copy       x into y with ordinary vector stores (floor_schedules.h: copy_stores), the unit;
//   read       a plain sum of x: the statistics pass's floor;
//   scale      y = x * a + b with the kernel's kind of stores (streaming where it streams): the
//              normalization pass's floor;
//   stats      the kernel's statistics pass alone: the moments of every tile (gn_nhwc_moments),
//              split over the threads as the kernel splits it;
//   normalize  the kernel's normalization pass alone (gn_nhwc_apply, the tiles of each range
//              last first, streaming stores where the kernel streams), with the coefficients of
//              one statistics pass;
//   kernel     the whole forward (gn_forward: both passes, and the merges of the tiles' moments
//              and the coefficients between them);
// on the same threads (omp_parallel_for.h, as torch's at::parallel_for splits a range), and prints
// the medians of the per-round ratios to the copy. Before timing, the two passes alone must give
// the kernel's output bit for bit (exit status 1 where they do not: the program no longer takes
// the kernel's steps). Shapes whose samples fit the budget (one task per sample, the passes
// interleaved sample by sample) are refused. The cache choices are the installed library's
// (group_norm_cpu_choices(), with the environment's OPBRIDGE_GROUP_NORM_* overrides).
//
// Build from the repository root with opbridge installed from it, and run:
//   P=$(python -c "import opbridge, os; print(os.path.dirname(opbridge.__file__))")
//   g++ -O3 -std=c++17 -mavx2 -mfma -mf16c -fopenmp -Iops/group_norm -Icpp -Icpp/include -Ibenchmarks/cpp
//       benchmarks/cpp/group_norm_passes.cpp $P/lib/libopbridge_kernels.a -o /tmp/gn_passes  (one line)
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close /tmp/gn_passes [--rounds R] [--groups G] [--silu] N,C,H,W ...
// On a machine with AVX-512 (which the installed library's kernel dispatches to there), time that
// kernel instead: add -mavx512f -mavx512bw -mavx512vl -mavx512dq (as group_norm_ab_side.cpp, the
// instruction set follows the compiler's target). The two
// differ there: on an AMD EPYC Zen 4, 2,128,64,64, the statistics pass took 1.06-1.10x a copy with
// AVX2 and 0.76-0.83x with AVX-512, the whole forward 2.37-2.80x and 2.08-2.46x.
// Exit status: 0, 1 (passes and kernel differ), 2 (bad arguments).
#if defined(__AVX512F__)
#define OPBRIDGE_ISA_AVX512 1
#else
#define OPBRIDGE_ISA_AVX2 1
#endif
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "common/simd_isa.h"
#include "floor_schedules.h"
#include "group_norm.h"
#include "group_norm_bench.h"
#include "group_norm_isa.h"
#include "group_norm_simd.h"
#include "omp_parallel_for.h"

namespace opbridge {
namespace {

// The kernel's two passes over the tiles of a channels-last tensor, as gn_forward_nhwc takes them
// on its tile path (one wave where the choices give one; refused otherwise).
template <Activation A>
struct TilePasses {
  const group_norm_isa::Args<float>& a;
  const ParallelFor& pf;
  int64_t S, C, G, tiles_per_sample = 0, tile_rows = 0, tiles = 0;
  bool stream = false;
  std::vector<GnMoments> partial;
  std::vector<GnCoefficients> k;

  TilePasses(const group_norm_isa::Args<float>& args, const ParallelFor& p)
      : a(args), pf(p), S(args.d.S), C(args.d.C), G(args.d.G) {
    const int64_t row_bytes = C * 4;
    stream = a.d.N * S * row_bytes >= a.stream_bytes && C % SimdIsa::W == 0;
    tile_rows = gn_tile_rows(S, row_bytes, &tiles_per_sample);
    tiles = a.d.N * tiles_per_sample;
    partial.resize(static_cast<size_t>(tiles * G));
    k.resize(static_cast<size_t>(a.d.N));
  }
  void range(int64_t t, int64_t* n, int64_t* r0, int64_t* nr) const {
    *n = t / tiles_per_sample;
    *r0 = (t % tiles_per_sample) * tile_rows;
    *nr = std::min(tile_rows, S - *r0);
  }
  void stats() {
    pf(tiles, 1, [&](int64_t begin, int64_t end) {
      GnRowScratch sc(C, G);
      for (int64_t t = begin; t < end; ++t) {
        int64_t n = 0, r0 = 0, nr = 0;
        range(t, &n, &r0, &nr);
        gn_nhwc_moments<SimdIsa>(a.x + (n * S + r0) * C, nr, C, G, partial.data() + t * G, &sc);
      }
    });
  }
  void coefficients() {
    std::vector<GnMoments> merged(static_cast<size_t>(G));
    for (int64_t n = 0; n < a.d.N; ++n) {
      gn_merge_tiles(partial.data() + n * tiles_per_sample * G, tiles_per_sample, G, merged.data());
      gn_sample_coefficients<SimdIsa>(a, merged.data(), nullptr, nullptr, &k[static_cast<size_t>(n)]);
    }
  }
  void normalize() {
    pf(tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = end - 1; t >= begin; --t) {
        int64_t n = 0, r0 = 0, nr = 0;
        range(t, &n, &r0, &nr);
        const float* x = a.x + (n * S + r0) * C;
        float* y = a.y + (n * S + r0) * C;
        if (stream) {
          gn_nhwc_apply<SimdIsa, A, true>(x, y, nr, C, k[static_cast<size_t>(n)], a.act, static_cast<const float*>(nullptr), false);
        } else {
          gn_nhwc_apply<SimdIsa, A, false>(x, y, nr, C, k[static_cast<size_t>(n)], a.act, static_cast<const float*>(nullptr), false);
        }
      }
      if (stream) SimdIsa::fence();
    });
  }
};

}  // namespace
}  // namespace opbridge

using opbridge::ParallelFor;
using omp_parallel_for::median;

template <opbridge::Activation A>
int run_shape(const opbridge::group_norm_isa::Args<float>& a, const ParallelFor& pf, int rounds, const char* name) {
  const int64_t n = a.d.N * a.d.C * a.d.S;
  const size_t bytes = static_cast<size_t>(n) * 4;
  opbridge::TilePasses<A> passes(a, pf);
  std::vector<float> kernel_y(static_cast<size_t>(n));
  opbridge::gn_forward<opbridge::SimdIsa, float>(a, pf);
  std::memcpy(kernel_y.data(), a.y, bytes);
  std::memset(a.y, 0, bytes);
  passes.stats();
  passes.coefficients();
  passes.normalize();
  int64_t differing = 0;
  for (int64_t i = 0; i < n; ++i) differing += std::memcmp(&a.y[i], &kernel_y[static_cast<size_t>(i)], 4) != 0;

  float* x = const_cast<float*>(a.x);
  float* y = a.y;
  volatile float sink = 0.f;
  const std::function<void()> copy = [&] {
    pf(n, int64_t{1} << 16, [&](int64_t b0, int64_t e0) { floor_schedules::copy_stores(x + b0, y + b0, e0 - b0); });
  };
  const std::function<void()> read = [&] {
    pf(n, int64_t{1} << 16, [&](int64_t b0, int64_t e0) { sink = sink + floor_schedules::read_sum(x + b0, e0 - b0); });
  };
  // With the kernel's kind of stores (streaming ones need a vector-aligned start).
  const std::function<void()> scale = [&] {
    pf(n, int64_t{1} << 16, [&](int64_t b0, int64_t e0) {
      if (passes.stream && b0 % floor_schedules::kW == 0) {
        floor_schedules::scale_shift<true>(x + b0, y + b0, e0 - b0);
        _mm_sfence();
      } else {
        floor_schedules::scale_shift<false>(x + b0, y + b0, e0 - b0);
      }
    });
  };
  const std::function<void()> stats = [&] { passes.stats(); };
  const std::function<void()> normalize = [&] { passes.normalize(); };
  const std::function<void()> kernel = [&] { opbridge::gn_forward<opbridge::SimdIsa, float>(a, pf); };
  const gn_bench::Timer timed(copy);
  const std::function<void()>* sides[] = {&read, &scale, &stats, &normalize, &kernel};
  for (const auto* f : sides) timed(*f);  // warm-up
  std::vector<double> r[5], t_c;
  for (int round = 0; round < rounds; ++round) {
    double c = timed(copy);
    double t[5];
    for (int i = 0; i < 5; ++i) t[i] = timed(*sides[i]);
    c = std::min(c, timed(copy));
    for (int i = 0; i < 5; ++i) r[i].push_back(t[i] / c);
    t_c.push_back(c * 1e6);
  }
  std::printf("%-16s %6lld %8.1f %6.2f %6.2f %6.2f %9.2f %6.2f  %s %lld\n", name,
              static_cast<long long>(passes.tiles_per_sample), median(t_c), median(r[0]), median(r[1]), median(r[2]),
              median(r[3]), median(r[4]), passes.stream ? "yes" : "no", static_cast<long long>(differing));
  std::fflush(stdout);
  return differing == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  gn_bench::Options opt;
  opt.rounds = 15;
  if (!gn_bench::parse(argc, argv, {}, &opt)) return 2;
  const int64_t groups = opt.groups;
  const bool silu = opt.silu;
  gn_bench::keep_freed_memory();
  const opbridge::GroupNormCpuChoices& ch = opbridge::group_norm_cpu_choices();
  const ParallelFor pf(omp_parallel_for::omp_runner, nullptr);
#if defined(__AVX512F__)
  const char* const kIsaName = "AVX-512";
#else
  const char* const kIsaName = "AVX2";
#endif
  std::printf("%s; %d threads; G = %lld; channels-last%s; cache budget %lld KiB, streaming from %lld KiB, waves of %lld KiB; "
              "%d rounds; medians of time / a copy's\n",
              kIsaName, omp_get_max_threads(), static_cast<long long>(groups),
              silu ? " + SiLU" : "",
              static_cast<long long>(ch.cache_budget >> 10), static_cast<long long>(ch.stream_bytes >> 10),
              static_cast<long long>(ch.wave_bytes >> 10), opt.rounds);
  std::printf("%-16s %6s %8s %6s %6s %6s %9s %6s  %s\n", "N,C,H,W", "tiles", "copy us", "read", "scale", "stats",
              "normalize", "kernel", "streamed differing");
  int status = 0;
  for (const auto& sh : opt.shapes) {
    const int64_t N = sh[0], C = sh[1], S = sh[2] * sh[3], n = N * C * S;
    char name[64];
    std::snprintf(name, sizeof(name), "%lld,%lld,%lld,%lld", static_cast<long long>(N), static_cast<long long>(C),
                  static_cast<long long>(sh[2]), static_cast<long long>(sh[3]));
    const int64_t sample_bytes = S * C * 4;
    const bool stream = n * 4 >= ch.stream_bytes && C % opbridge::SimdIsa::W == 0;
    const int64_t budget = stream ? ch.cache_budget_streamed : ch.cache_budget;
    const int64_t wave = std::max<int64_t>(1, std::min<int64_t>(N, std::max(4 * budget, ch.wave_bytes) / sample_bytes));
    if (sample_bytes <= budget && N >= opbridge::kGnMinSampleTasks) {
      std::fprintf(stderr, "%s: samples of %lld KiB fit the cache budget (one task per sample, no tiles)\n", name,
                   static_cast<long long>(sample_bytes >> 10));
      return 2;
    }
    if (wave < N) {
      std::fprintf(stderr, "%s: the kernel takes %lld waves (this program times one)\n", name,
                   static_cast<long long>((N + wave - 1) / wave));
      return 2;
    }
    const size_t bytes = static_cast<size_t>((n * 4 + 63) / 64 * 64);
    float* x = static_cast<float*>(std::aligned_alloc(64, bytes));
    float* y = static_cast<float*>(std::aligned_alloc(64, bytes));
    std::vector<float> w, b;
    gn_bench::fill_inputs(x, n, C, &w, &b);
    std::memset(y, 0, bytes);
    const opbridge::group_norm_isa::Args<float> a = gn_bench::kernel_args(x, w, b, y, N, C, S, groups, true, silu, ch);
    const int r = silu ? run_shape<opbridge::Activation::kSilu>(a, pf, opt.rounds, name)
                       : run_shape<opbridge::Activation::kNone>(a, pf, opt.rounds, name);
    status = std::max(status, r);
    std::free(x);
    std::free(y);
  }
  return status;
}
