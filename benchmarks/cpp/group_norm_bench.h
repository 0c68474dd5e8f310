// What the GroupNorm programs built on the kernel's own header share (group_norm_ab.cpp,
// group_norm_passes.cpp): their arguments, their inputs, the kernel's arguments with the installed
// library's cache choices, and how many calls make one timing.
#pragma once

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "group_norm.h"
#include "group_norm_isa.h"

namespace gn_bench {

struct Options {
  int rounds = 0;
  int64_t groups = 32;
  bool silu = false, nchw = false, fresh = false, backward = false;
  std::vector<std::vector<int64_t>> shapes;  // N, C, H, W
};

// [--rounds R] [--groups G] [--silu] and the program's own `flags` (of "--nchw", "--fresh",
// "--backward"), then shapes N,C,H,W (C a multiple of G). False, with the usage printed, on anything else or no shape.
inline bool parse(int argc, char** argv, std::initializer_list<const char*> flags, Options* o) {
  std::string usage = std::string("usage: ") + argv[0] + " [--rounds R] [--groups G] [--silu]";
  for (const char* f : flags) usage += std::string(" [") + f + "]";
  usage += " N,C,H,W ...\n(C a multiple of G; --groups before the shapes)\n";
  const auto takes = [&](const std::string& s) {
    return std::find_if(flags.begin(), flags.end(), [&](const char* f) { return s == f; }) != flags.end();
  };
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    long long v[4];
    if (s == "--rounds" && i + 1 < argc) {
      o->rounds = std::max(1, std::atoi(argv[++i]));
    } else if (s == "--groups" && i + 1 < argc) {
      o->groups = std::atol(argv[++i]);
    } else if (s == "--silu") {
      o->silu = true;
    } else if (s == "--nchw" && takes(s)) {
      o->nchw = true;
    } else if (s == "--fresh" && takes(s)) {
      o->fresh = true;
    } else if (s == "--backward" && takes(s)) {
      o->backward = true;
    } else if (std::sscanf(argv[i], "%lld,%lld,%lld,%lld", &v[0], &v[1], &v[2], &v[3]) == 4 && v[0] > 0 && v[1] > 0 &&
               v[2] > 0 && v[3] > 0 && o->groups > 0 && v[1] % o->groups == 0) {
      o->shapes.push_back({v[0], v[1], v[2], v[3]});
    } else {
      std::fputs(usage.c_str(), stderr);
      return false;
    }
  }
  if (o->shapes.empty()) {
    std::fprintf(stderr, "%s: no shapes given\n", argv[0]);
    return false;
  }
  return true;
}

// Freed outputs stay in the heap (the benchmarks' malloc settings), as under the asv suite.
inline void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 2147483647);
}

// x[0..n) ~ N(0.5, 2), and C weights and biases from the same generator: every program times the
// same numbers.
inline void fill_inputs(float* x, int64_t n, int64_t C, std::vector<float>* w, std::vector<float>* b) {
  std::mt19937 gen(12345);
  std::normal_distribution<float> normal(0.5f, 2.0f);
  for (int64_t i = 0; i < n; ++i) x[i] = normal(gen);
  w->resize(static_cast<size_t>(C));
  b->resize(static_cast<size_t>(C));
  for (float& v : *w) v = normal(gen);
  for (float& v : *b) v = normal(gen);
}

// The kernel's arguments for x [N, C, S] (or [N, S, C]), eps 1e-5, no statistics out.
inline opbridge::group_norm_isa::Args<float> kernel_args(const float* x, const std::vector<float>& w,
                                                         const std::vector<float>& b, float* y, int64_t N, int64_t C,
                                                         int64_t S, int64_t G, bool channels_last, bool silu,
                                                         const opbridge::GroupNormCpuChoices& ch) {
  opbridge::GroupNormDims d;
  d.N = N;
  d.C = C;
  d.S = S;
  d.G = G;
  d.channels_last = channels_last;
  return {x,
          w.data(),
          b.data(),
          y,
          d,
          1e-5,
          silu ? opbridge::Activation::kSilu : opbridge::Activation::kNone,
          nullptr,
          nullptr,
          ch.cache_budget,
          ch.cache_budget_streamed,
          ch.stream_bytes,
          ch.wave_bytes,
          ch.fuse_groups};
}

// Seconds per call of f over `calls` calls, where `calls` makes about 10 ms of copying (at least 2).
class Timer {
 public:
  explicit Timer(const std::function<void()>& copy) {
    const auto t0 = std::chrono::steady_clock::now();
    copy();
    copy();
    const double t_copy = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 2;
    calls_ = std::max(2, static_cast<int>(0.01 / std::max(t_copy, 1e-7)));
  }
  double operator()(const std::function<void()>& f) const {
    const auto s = std::chrono::steady_clock::now();
    for (int i = 0; i < calls_; ++i) f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count() / calls_;
  }

 private:
  int calls_ = 2;
};

}  // namespace gn_bench
