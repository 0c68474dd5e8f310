// The floor of a one-read normalization, against a copy: what any kernel that must read a whole
// unit (a GroupNorm group, or a channels-last sample) before writing any of it can reach, with
// no arithmetic at all. Each thread walks its half of the tensor unit by unit: sum the unit (the
// statistics' read, from memory), then read it again (from the L2, where it still is) and write
// y = x * a + b (the normalization's pass). GroupNorm's goal of 1.10x a copy "where a unit fits
// the L2" assumes this costs about a copy; this program measures how close it comes on the
// machine at hand, per unit size, with streaming and with ordinary stores. A channels-last unit
// whose groups are columns of its rows can also be taken a strip of columns at a time (the strip's
// groups read over all the rows, then normalized): the "strip" schedules walk each thread's half
// as rows of C floats, a strip of 16 or 32 of them (one or two cache lines a row) at a time.
//
// Build and run (any x86-64 with AVX2; AVX-512 is used where the compiler targets it):
//   g++ -O2 -std=c++17 -march=native -fopenmp benchmarks/cpp/one_read_floor.cpp -o /tmp/one_read_floor
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close /tmp/one_read_floor [MiB, default 8] [C, default 128]
// Prints, per schedule, the median time of 31 rounds and its ratio to a copy of the same size timed
// in alternating rounds (the faster of memcpy and a loop of ordinary vector stores, as x.clone()
// writes: floor_schedules.h's copy_stores).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "floor_schedules.h"

namespace {

using namespace floor_schedules;

// Runs body(begin, count) on each thread's contiguous half (third, ...) of n elements.
void on_threads(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t per = n / nt / (4 * kW) * (4 * kW);
    body(t * per, t + 1 == nt ? n - t * per : per);
  }
}

// The columns [c0, c0 + w) of `rows` rows of C floats: their sum (the read), or y = x * a + b
// over them walking the rows backwards (the rows read last first), w a multiple of kW.
float strip_sum(const float* x, int64_t rows, int64_t C, int64_t w) {
  V a = vzero(), b = vzero();
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) {
    for (int64_t c = 0; c < w; c += kW) {
      a = vadd(a, vload(x + r * C + c));
      b = vadd(b, vload(x + (r + 1) * C + c));
    }
  }
  for (; r < rows; ++r) {
    for (int64_t c = 0; c < w; c += kW) a = vadd(a, vload(x + r * C + c));
  }
  return vsum(vadd(a, b));
}

void strip_scale_shift(const float* x, float* y, int64_t rows, int64_t C, int64_t w) {
  const V s = vset(1.1f), o = vset(0.2f);
  for (int64_t r = rows - 1; r >= 0; --r) {
    for (int64_t c = 0; c < w; c += kW) vstore(y + r * C + c, vfma(vload(x + r * C + c), s, o));
  }
}

double median_us(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::atol(argv[1]) : 8;
  const int64_t C = argc > 2 ? std::atol(argv[2]) : 128;
  const int64_t n = mib * (int64_t{1} << 20) / 4;
  float* x = static_cast<float*>(std::aligned_alloc(64, n * 4));
  float* y = static_cast<float*>(std::aligned_alloc(64, n * 4));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1013) * 1e-3f;
  std::memset(y, 0, n * 4);
  volatile float sink = 0.f;

  const auto copy = [&] { on_threads(n, [&](int64_t b, int64_t m) { std::memcpy(y + b, x + b, m * 4); }); };
  const auto copy_loop = [&] { on_threads(n, [&](int64_t b, int64_t m) { copy_stores(x + b, y + b, m); }); };
  struct Schedule {
    const char* name;
    int64_t unit_bytes;  // 0: the whole half
    std::function<void()> run;
  };
  std::vector<Schedule> schedules;
  schedules.push_back({"read only", 0, [&] {
                         on_threads(n, [&](int64_t b, int64_t m) { sink = sink + read_sum(x + b, m); });
                       }});
  schedules.push_back({"write y = x * a + b, streaming stores, from memory", 0, [&] {
                         on_threads(n, [&](int64_t b, int64_t m) { scale_shift<true>(x + b, y + b, m); });
                       }});
  for (int64_t kib : {32, 128, 256, 512, 1024, 2048}) {
    for (bool stream : {true, false}) {
      const int64_t unit = kib * 1024 / 4;
      schedules.push_back({stream ? "one read, streaming stores" : "one read, ordinary stores", kib * 1024, [=, &sink] {
                             on_threads(n, [&](int64_t b, int64_t m) {
                               for (int64_t u = 0; u < m; u += unit) {
                                 const int64_t len = std::min(unit, m - u);
                                 sink = sink + read_sum(x + b + u, len);
                                 if (stream) {
                                   scale_shift<true>(x + b + u, y + b + u, len);
                                 } else {
                                   scale_shift<false>(x + b + u, y + b + u, len);
                                 }
                               }
                             });
                           }});
    }
  }

  static const char* const kStripNames[2][2] = {
      {"strips of 16 columns: sum only", "strips of 16 columns: sum, then y = x * a + b"},
      {"strips of 32 columns: sum only", "strips of 32 columns: sum, then y = x * a + b"}};
  for (int64_t w : {16, 32}) {
    if (C % w != 0) continue;
    for (bool twice : {false, true}) {
      schedules.push_back({kStripNames[w / 32][twice ? 1 : 0], 0, [=, &sink] {
                             on_threads(n, [&](int64_t b, int64_t m) {
                               const int64_t rows = m / C;
                               for (int64_t c0 = 0; c0 < C; c0 += w) {
                                 sink = sink + strip_sum(x + b + c0, rows, C, w);
                                 if (twice) strip_scale_shift(x + b + c0, y + b + c0, rows, C, w);
                               }
                             });
                           }});
    }
  }

  const auto time_us = [](const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) f();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 10;
  };
  std::printf(
      "%lld MiB float32, %d threads, %d-float vectors, strips in rows of %lld floats; ratio = time / time of a copy "
      "(memcpy or a store loop)\n",
      static_cast<long long>(mib), omp_get_max_threads(), kW, static_cast<long long>(C));
  for (const Schedule& s : schedules) {
    for (int i = 0; i < 5; ++i) {
      copy();
      s.run();
    }
    std::vector<double> tc, ts;
    for (int r = 0; r < 31; ++r) {  // alternating rounds: drifts in the machine hit both alike
      tc.push_back(std::min(time_us(copy), time_us(copy_loop)));
      ts.push_back(time_us(s.run));
    }
    const double c = median_us(tc), t = median_us(ts);
    if (s.unit_bytes > 0) {
      std::printf("  %-52s unit %5lld KiB  %8.1f us  %.2fx\n", s.name, static_cast<long long>(s.unit_bytes >> 10), t,
                  t / c);
    } else {
      std::printf("  %-67s %8.1f us  %.2fx\n", s.name, t, t / c);
    }
  }
  std::free(x);
  std::free(y);
  return 0;
}
