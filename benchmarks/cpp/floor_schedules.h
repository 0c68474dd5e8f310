// The no-arithmetic schedules of the floor programs (one_read_floor.cpp, group_norm_vs_floor.cpp):
// vector wrappers (AVX-512 where the compiler targets it, else AVX2), a sum of a range (the
// statistics' read) and y = x * a + b over a range (the normalization's pass), streaming or not.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace floor_schedules {

#if defined(__AVX512F__)
using V = __m512;
constexpr int kW = 16;
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V vset(float a) { return _mm512_set1_ps(a); }
inline V vzero() { return _mm512_setzero_ps(); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline void vstream(float* p, V v) { _mm512_stream_ps(p, v); }
inline float vsum(V v) { return _mm512_reduce_add_ps(v); }
#else
using V = __m256;
constexpr int kW = 8;
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V vset(float a) { return _mm256_set1_ps(a); }
inline V vzero() { return _mm256_setzero_ps(); }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
inline void vstream(float* p, V v) { _mm256_stream_ps(p, v); }
inline float vsum(V v) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
#endif

// Sum of p[0..n), in four chains (the read is the cost, not the adds).
inline float read_sum(const float* p, int64_t n) {
  V a = vzero(), b = vzero(), c = vzero(), d = vzero();
  int64_t i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW) {
    a = vadd(a, vload(p + i));
    b = vadd(b, vload(p + i + kW));
    c = vadd(c, vload(p + i + 2 * kW));
    d = vadd(d, vload(p + i + 3 * kW));
  }
  float s = vsum(vadd(vadd(a, b), vadd(c, d)));
  for (; i < n; ++i) s += p[i];
  return s;
}

// y = x * 1.1 + 0.2 over n elements. Streaming stores need y aligned to a vector: callers
// stream only from such starts.
template <bool Stream>
inline void scale_shift(const float* x, float* y, int64_t n) {
  const V s = vset(1.1f), o = vset(0.2f);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    const V v = vfma(vload(x + i), s, o);
    if (Stream) {
      vstream(y + i, v);
    } else {
      vstore(y + i, v);
    }
  }
  for (; i < n; ++i) y[i] = x[i] * 1.1f + 0.2f;
}

// y = x over n elements with ordinary vector stores: how torch's x.clone() copies (glibc's
// memcpy switches to streaming stores above a size threshold: on an AMD EPYC Zen 3, 4 MiB on one
// thread from the L3 took 150-185 us with memcpy, 80 us with x.clone() and 130-145 us with this
// loop). The programs' copy is the faster of the two in each round.
inline void copy_stores(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW) {
    const V a = vload(x + i), b = vload(x + i + kW), c = vload(x + i + 2 * kW), d = vload(x + i + 3 * kW);
    vstore(y + i, a);
    vstore(y + i + kW, b);
    vstore(y + i + 2 * kW, c);
    vstore(y + i + 3 * kW, d);
  }
  for (; i < n; ++i) y[i] = x[i];
}

}  // namespace floor_schedules
