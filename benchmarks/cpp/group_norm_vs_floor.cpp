// GroupNorm's forward kernel against the memory floor, side by side in one process, on the machine
// at hand: per shape and layout, rounds alternate between
//   copy      x into y, the faster of memcpy and a loop of ordinary vector stores in each round
//             (floor_schedules.h: copy_stores; x.clone() writes with ordinary stores): the unit
//             every figure is given in;
//   floor     the fastest of three schedules with no arithmetic: one_read_floor.cpp's for the
//             kernel's own unit (a group of [N, C, H, W], a sample of channels-last: sum the unit,
//             then read it again and write y = x * a + b), with streaming and with ordinary
//             stores, and two reads (sum all of x, then read it again and write all of y, each
//             pass split over the threads). Where the unit fits the L2 the second read comes from
//             there; where it does not, from memory (or a large L3), and two reads is the floor;
//   kernel    opbridge::group_norm_cpu (the runtime-dispatched AVX-512 / AVX2 / baseline kernel
//             of the torch op and the ORT op), without and with SiLU;
// each on the same threads (an OpenMP parallel-for that splits a range the way torch's
// at::parallel_for does), and prints the medians of the per-round ratios to the copy. The kernel's
// result is checked against a float64 reference computed here, so that a fast wrong answer cannot
// pass unnoticed. GroupNorm's goals (issue "GroupNorm on real diffusion models"): <= 1.10x a copy
// where the unit fits the L2, <= 1.6x otherwise.
//
// Build against the installed package (its libopbridge_kernels.a and headers), or a build dir's:
//   P=$(python -c "import opbridge, os; print(os.path.dirname(opbridge.__file__))")
//   g++ -O2 -std=c++17 -march=native -fopenmp -I$P/include -o /tmp/gn_vs_floor
//       benchmarks/cpp/group_norm_vs_floor.cpp $P/lib/libopbridge_kernels.a       (one line)
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close /tmp/gn_vs_floor [--rounds R] [--groups G] [N,C,H,W ...]
// Default shapes: those of the GroupNormVsCopy asv benchmark. Exit status 1 if a result is wrong.
#include <immintrin.h>
#include <omp.h>

#include <opbridge/group_norm.h>
#include <opbridge/parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "floor_schedules.h"
#include "omp_parallel_for.h"

namespace {

using namespace floor_schedules;

using omp_parallel_for::median;
using omp_parallel_for::omp_runner;

// float64 GroupNorm of x ([N, C, S], or [N, S, C] when channels_last), with SiLU if silu.
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                              int64_t N, int64_t C, int64_t S, int64_t G, bool cl, bool silu) {
  const int64_t Cg = C / G;
  std::vector<double> y(x.size());
  const auto at = [&](int64_t n, int64_t c, int64_t s) { return cl ? (n * S + s) * C + c : (n * C + c) * S + s; };
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      double sum = 0.0;
      for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) {
        for (int64_t s = 0; s < S; ++s) sum += x[at(n, c, s)];
      }
      const double mean = sum / static_cast<double>(Cg * S);
      double sq = 0.0;
      for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) {
        for (int64_t s = 0; s < S; ++s) sq += (x[at(n, c, s)] - mean) * (x[at(n, c, s)] - mean);
      }
      const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(Cg * S) + 1e-5);
      for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) {
        for (int64_t s = 0; s < S; ++s) {
          const double z = (x[at(n, c, s)] - mean) * rstd * w[c] + b[c];
          y[at(n, c, s)] = silu ? z / (1.0 + std::exp(-z)) : z;
        }
      }
    }
  }
  return y;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

struct Shape {
  int64_t N, C, H, W;
};

bool parse_shape(const char* s, Shape* out) {
  long long v[4];
  if (std::sscanf(s, "%lld,%lld,%lld,%lld", &v[0], &v[1], &v[2], &v[3]) != 4) return false;
  *out = Shape{v[0], v[1], v[2], v[3]};
  return v[0] > 0 && v[1] > 0 && v[2] > 0 && v[3] > 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 21;
  int64_t groups = 32;
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    Shape s{};
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--groups" && i + 1 < argc) {
      groups = std::atol(argv[++i]);
    } else if (parse_shape(argv[i], &s)) {
      shapes.push_back(s);
    } else {
      std::fprintf(stderr, "usage: %s [--rounds R] [--groups G] [N,C,H,W ...]\n", argv[0]);
      return 2;
    }
  }
  if (shapes.empty()) {
    shapes = {{8, 256, 32, 32}, {2, 512, 64, 64}, {2, 128, 64, 64}, {1, 512, 64, 64},
              {4, 512, 128, 128}, {64, 32, 32, 32}, {32, 64, 32, 32}};
  }
  for (const Shape& sh : shapes) {
    if (groups <= 0 || sh.C % groups != 0) {
      std::fprintf(stderr, "%lld,%lld,%lld,%lld: C is not a multiple of G = %lld\n", static_cast<long long>(sh.N),
                   static_cast<long long>(sh.C), static_cast<long long>(sh.H), static_cast<long long>(sh.W),
                   static_cast<long long>(groups));
      return 2;
    }
  }
  const opbridge::GroupNormCpuChoices& ch = opbridge::group_norm_cpu_choices();
  std::printf("%s; %d threads; %d-float vectors; G = %lld; float32; %d rounds\n", cpu_model().c_str(),
              omp_get_max_threads(), kW, static_cast<long long>(groups), rounds);
  // The kernel's cache-dependent choices on this machine, beside the figures they produce.
  std::printf("kernel choices: L2 %lld KiB, L3 %lld KiB (as the OS reports them); cache budget %lld KiB "
              "(%lld KiB with streaming stores); streaming stores from %lld KiB; channels-last waves of "
              "%lld KiB or more; [N, C, S] groups fused: %s%s\n",
              static_cast<long long>(ch.l2_bytes / 1024), static_cast<long long>(ch.l3_bytes / 1024),
              static_cast<long long>(ch.cache_budget / 1024), static_cast<long long>(ch.cache_budget_streamed / 1024),
              static_cast<long long>(ch.stream_bytes / 1024), static_cast<long long>(ch.wave_bytes / 1024),
              ch.fuse_groups ? "yes" : "no", ch.overridden ? " (set by OPBRIDGE_GROUP_NORM_CACHE_BUDGET / _STREAM_BYTES / _WAVE_BYTES / _FUSE / _L2_BYTES / _L3_BYTES)" : "");
  std::printf("time / time of a copy (medians of per-round ratios); unit: a group (NCHW) or a sample (NHWC)\n");
  std::printf("%-14s %-13s %9s  %-11s %-11s %-11s %s\n", "N,C,H,W", "layout", "unit KiB", "floor", "kernel",
              "+ SiLU", "max |error|");
  const opbridge::ParallelFor pf(omp_runner, nullptr);
  volatile float sink = 0.f;
  bool all_ok = true;
  for (const Shape& sh : shapes) {
    const int64_t S = sh.H * sh.W, n = sh.N * sh.C * S;
    float* x = static_cast<float*>(std::aligned_alloc(64, (n * 4 + 63) / 64 * 64));
    float* y = static_cast<float*>(std::aligned_alloc(64, (n * 4 + 63) / 64 * 64));
    std::vector<float> xv(static_cast<size_t>(n)), w(static_cast<size_t>(sh.C)), b(static_cast<size_t>(sh.C));
    std::mt19937 gen(12345);
    std::normal_distribution<float> normal(0.5f, 2.0f);
    for (float& v : xv) v = normal(gen);
    for (float& v : w) v = normal(gen);
    for (float& v : b) v = normal(gen);
    std::memcpy(x, xv.data(), n * 4);
    std::memset(y, 0, n * 4);
    for (bool cl : {false, true}) {
      const opbridge::GroupNormDims d =
          opbridge::group_norm_dims(std::vector<int64_t>{sh.N, sh.C, sh.H, sh.W}, groups, cl);
      // The kernel's unit: what must be read whole before any of it is written.
      const int64_t unit = cl ? sh.C * S : sh.C / groups * S;
      const int64_t units = n / unit;
      double max_err = 0.0;
      const auto run_kernel = [&](opbridge::Activation act) {
        const opbridge::Status st =
            opbridge::group_norm_cpu<float>(x, w.data(), b.data(), y, d, 1e-5, act, nullptr, nullptr, pf);
        if (!st.ok()) {
          std::fprintf(stderr, "group_norm_cpu: %s\n", st.message().c_str());
          std::exit(1);
        }
      };
      for (bool silu : {false, true}) {
        run_kernel(silu ? opbridge::Activation::kSilu : opbridge::Activation::kNone);
        const std::vector<double> ref = reference(xv, w, b, sh.N, sh.C, S, groups, cl, silu);
        for (int64_t i = 0; i < n; ++i) {
          const double e = std::abs(static_cast<double>(y[i]) - ref[i]) / std::max(1.0, std::abs(ref[i]));
          max_err = std::isnan(e) ? INFINITY : std::max(max_err, e);
        }
      }
      const std::function<void()> copy = [&] {
        pf(n, int64_t{1} << 16, [&](int64_t b0, int64_t e0) { std::memcpy(y + b0, x + b0, (e0 - b0) * 4); });
      };
      const std::function<void()> copy_loop = [&] {
        pf(n, int64_t{1} << 16, [&](int64_t b0, int64_t e0) { copy_stores(x + b0, y + b0, e0 - b0); });
      };
      // Streaming stores need aligned vectors: every unit starts at one where unit % kW == 0.
      const bool can_stream = unit % kW == 0;
      const auto floor_run = [&](bool stream) {
        stream = stream && can_stream;
        pf(units, 1, [&](int64_t u0, int64_t u1) {
          for (int64_t u = u0; u < u1; ++u) {
            sink = sink + read_sum(x + u * unit, unit);
            if (stream) {
              scale_shift<true>(x + u * unit, y + u * unit, unit);
            } else {
              scale_shift<false>(x + u * unit, y + u * unit, unit);
            }
          }
          _mm_sfence();
        });
      };
      // Two reads: all of x, then all of x again while writing y, each pass split over the threads
      // (what a unit that does not fit the L2 costs at least, and what a kernel can do where there
      // are fewer units than threads).
      const auto two_reads = [&] {
        pf(n, int64_t{1} << 16, [&](int64_t b0, int64_t e0) { sink = sink + read_sum(x + b0, e0 - b0); });
        pf((n + kW - 1) / kW, int64_t{1} << 12, [&](int64_t v0, int64_t v1) {  // vectors: aligned starts
          scale_shift<true>(x + v0 * kW, y + v0 * kW, std::min(n, v1 * kW) - v0 * kW);
          _mm_sfence();
        });
      };
      const std::vector<std::function<void()>> runs = {
          copy, [&] { floor_run(true); }, [&] { floor_run(false); }, two_reads,
          [&] { run_kernel(opbridge::Activation::kNone); }, [&] { run_kernel(opbridge::Activation::kSilu); }};
      // Calls per timing: about 20 ms of copying, at least 2.
      const auto t0 = std::chrono::steady_clock::now();
      copy();
      copy();
      const double t_copy = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 2;
      const int calls = std::max(2, static_cast<int>(0.02 / std::max(t_copy, 1e-7)));
      const auto timed = [&](const std::function<void()>& f) {
        const auto s = std::chrono::steady_clock::now();
        for (int i = 0; i < calls; ++i) f();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
      };
      for (const auto& f : runs) timed(f);  // warm-up
      std::vector<std::vector<double>> ratios(runs.size());
      for (int r = 0; r < rounds; ++r) {
        for (size_t k = 1; k < runs.size(); ++k) {
          // A copy right before each, so that drifts hit both alike.
          const double c = std::min(timed(copy), timed(copy_loop));
          ratios[k].push_back(timed(runs[k]) / c);
        }
      }
      const double floor = std::min({median(ratios[1]), median(ratios[2]), median(ratios[3])});
      const bool ok = max_err <= 1e-4;
      all_ok = all_ok && ok;
      char name[64];
      std::snprintf(name, sizeof(name), "%lld,%lld,%lld,%lld", static_cast<long long>(sh.N),
                    static_cast<long long>(sh.C), static_cast<long long>(sh.H), static_cast<long long>(sh.W));
      std::printf("%-14s %-13s %9.1f  %5.2fx      %5.2fx      %5.2fx      %.1e%s\n", name,
                  cl ? "channels_last" : "contiguous", static_cast<double>(unit) * 4 / 1024, floor,
                  median(ratios[4]), median(ratios[5]), max_err, ok ? "" : "  WRONG");
      std::fflush(stdout);
    }
    std::free(x);
    std::free(y);
  }
  return all_ok ? 0 : 1;
}
