// opbridge: 8 float lanes for kernels compiled for the architecture's baseline.
//
// Same interface as simd_avx2.h / simd_avx512.h (see there). On x86-64 two SSE2 registers
// (SSE2 is part of the x86-64 baseline); elsewhere fixed-size loops that the compiler
// vectorizes for the target (NEON on arm64). 16-bit types convert one element at a time with
// dtype.h's exact conversions. Everything has internal linkage: see simd_avx512.h for why.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/simd_loop_lanes.h"
#include "opbridge/dtype.h"

namespace opbridge {
namespace {

#if defined(__SSE2__)

struct SimdGeneric {
  static constexpr int W = 8;
  struct V {
    __m128 lo, hi;
  };

  static V zero() { return {_mm_setzero_ps(), _mm_setzero_ps()}; }
  static V set1(float a) { return {_mm_set1_ps(a), _mm_set1_ps(a)}; }
  static V add(V a, V b) { return {_mm_add_ps(a.lo, b.lo), _mm_add_ps(a.hi, b.hi)}; }
  static V sub(V a, V b) { return {_mm_sub_ps(a.lo, b.lo), _mm_sub_ps(a.hi, b.hi)}; }
  // a * b + c (two roundings: the baseline has no fused multiply-add)
  static V fmadd(V a, V b, V c) {
    return {_mm_add_ps(_mm_mul_ps(a.lo, b.lo), c.lo), _mm_add_ps(_mm_mul_ps(a.hi, b.hi), c.hi)};
  }
  static V mul(V a, V b) { return {_mm_mul_ps(a.lo, b.lo), _mm_mul_ps(a.hi, b.hi)}; }
  static V div(V a, V b) { return {_mm_div_ps(a.lo, b.lo), _mm_div_ps(a.hi, b.hi)}; }
  static V min(V a, V b) { return {_mm_min_ps(a.lo, b.lo), _mm_min_ps(a.hi, b.hi)}; }
  static V max(V a, V b) { return {_mm_max_ps(a.lo, b.lo), _mm_max_ps(a.hi, b.hi)}; }
  // cvtps2dq rounds by MXCSR: to nearest even unless the program changed the rounding mode.
  static V round(V a) {
    return {_mm_cvtepi32_ps(_mm_cvtps_epi32(a.lo)), _mm_cvtepi32_ps(_mm_cvtps_epi32(a.hi))};
  }
  static V pow2(V n) {
    const __m128i bias = _mm_set1_epi32(127);
    return {_mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(n.lo), bias), 23)),
            _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(n.hi), bias), 23))};
  }
  // n within pow2's range (the interface's): one product.
  static V scalef(V p, V n) { return mul(p, pow2(n)); }
  static V sub_n(V a, V b, int n) {
    const __m128i nn = _mm_set1_epi32(n);
    const __m128 klo = _mm_castsi128_ps(_mm_cmpgt_epi32(nn, _mm_setr_epi32(0, 1, 2, 3)));
    const __m128 khi = _mm_castsi128_ps(_mm_cmpgt_epi32(nn, _mm_setr_epi32(4, 5, 6, 7)));
    const V d = sub(a, b);
    return {_mm_and_ps(d.lo, klo), _mm_and_ps(d.hi, khi)};
  }
  static double hsum(V a) {
    const __m128 s = _mm_add_ps(a.lo, a.hi);
    __m128d d = _mm_add_pd(_mm_cvtps_pd(s), _mm_cvtps_pd(_mm_movehl_ps(s, s)));
    d = _mm_add_sd(d, _mm_unpackhi_pd(d, d));
    return _mm_cvtsd_f64(d);
  }
  static void hsum_w(const V* v, double* out) {
    for (int j = 0; j < W; ++j) {
      // ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), a tree as in the vector versions
      const __m128 s = _mm_add_ps(v[j].lo, v[j].hi);
      const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
      out[j] = static_cast<double>(_mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1))));
    }
  }

  static float to_f32(float v) { return v; }
  static float to_f32(Half v) { return half_to_float(v.bits); }
  static float to_f32(BFloat16 v) { return bf16_to_float(v.bits); }

  static V load(const float* p) { return {_mm_loadu_ps(p), _mm_loadu_ps(p + 4)}; }
  static void store(float* p, V a) {
    _mm_storeu_ps(p, a.lo);
    _mm_storeu_ps(p + 4, a.hi);
  }
  // Streaming stores for float; the 16-bit types convert one element at a time anyway.
  static void stream(float* p, V a) {
    _mm_stream_ps(p, a.lo);
    _mm_stream_ps(p + 4, a.hi);
  }
  template <class T>
  static void stream(T* p, V a) {
    store(p, a);
  }
  static void fence() { _mm_sfence(); }
  template <class T>
  static V load(const T* p) {
    alignas(16) float f[W];
    for (int l = 0; l < W; ++l) f[l] = to_f32(p[l]);
    return load(f);
  }
  template <class T>
  static void store(T* p, V a) {
    alignas(16) float f[W];
    store(f, a);
    for (int l = 0; l < W; ++l) from_f32(f[l], p + l);
  }
  template <class T>
  static V load_n(const T* p, int n) {
    alignas(16) float f[W] = {};
    for (int l = 0; l < n; ++l) f[l] = to_f32(p[l]);
    return load(f);
  }
  template <class T>
  static void store_n(T* p, V a, int n) {
    alignas(16) float f[W];
    store(f, a);
    for (int l = 0; l < n; ++l) from_f32(f[l], p + l);
  }

 private:
  static void from_f32(float v, float* p) { *p = v; }
  static void from_f32(float v, Half* p) { p->bits = float_to_half(v); }
  static void from_f32(float v, BFloat16* p) { p->bits = float_to_bf16(v); }
};

#else  // no SSE2: plain loops

// LoopLanes<float>: 8 lanes, two SSE registers' worth, so the per-lane partial sums of the
// kernels stay short.
struct SimdGeneric : LoopLanes<float> {
  static V sub(V a, V b) {
    for (int l = 0; l < W; ++l) a.v[l] -= b.v[l];
    return a;
  }
  static V mul(V a, V b) {
    for (int l = 0; l < W; ++l) a.v[l] *= b.v[l];
    return a;
  }
  static V div(V a, V b) {
    for (int l = 0; l < W; ++l) a.v[l] /= b.v[l];
    return a;
  }
  // As minps / maxps: b where either is NaN.
  static V min(V a, V b) {
    for (int l = 0; l < W; ++l) a.v[l] = a.v[l] < b.v[l] ? a.v[l] : b.v[l];
    return a;
  }
  static V max(V a, V b) {
    for (int l = 0; l < W; ++l) a.v[l] = a.v[l] > b.v[l] ? a.v[l] : b.v[l];
    return a;
  }
  static V round(V a) {
    for (int l = 0; l < W; ++l) a.v[l] = std::nearbyint(a.v[l]);
    return a;
  }
  static V pow2(V n) {
    for (int l = 0; l < W; ++l) n.v[l] = std::ldexp(1.0f, static_cast<int>(n.v[l]));
    return n;
  }
  // n within pow2's range (the interface's): one product.
  static V scalef(V p, V n) { return mul(p, pow2(n)); }
  // a - b in the first n lanes, 0 in the others.
  static V sub_n(V a, V b, int n) {
    for (int l = 0; l < W; ++l) a.v[l] = l < n ? a.v[l] - b.v[l] : 0.f;
    return a;
  }
  static void hsum_w(const V* v, double* out) {
    for (int j = 0; j < W; ++j) {
      float t[W];
      for (int l = 0; l < W; ++l) t[l] = v[j].v[l];
      for (int h = W / 2; h > 0; h /= 2) {
        for (int l = 0; l < h; ++l) t[l] += t[l + h];
      }
      out[j] = static_cast<double>(t[0]);
    }
  }

  static float to_f32(float v) { return v; }
  static float to_f32(Half v) { return half_to_float(v.bits); }
  static float to_f32(BFloat16 v) { return bf16_to_float(v.bits); }
  static void from_f32(float v, float* p) { *p = v; }
  static void from_f32(float v, Half* p) { p->bits = float_to_half(v); }
  static void from_f32(float v, BFloat16* p) { p->bits = float_to_bf16(v); }

  template <class T>
  static V load(const T* p) {
    V r;
    for (int l = 0; l < W; ++l) r.v[l] = to_f32(p[l]);
    return r;
  }
  // Loads the first n (< W) elements; the other lanes are 0.
  template <class T>
  static V load_n(const T* p, int n) {
    V r = zero();
    for (int l = 0; l < n; ++l) r.v[l] = to_f32(p[l]);
    return r;
  }
  template <class T>
  static void store(T* p, V a) {
    for (int l = 0; l < W; ++l) from_f32(a.v[l], p + l);
  }
  // Stores the first n (< W) lanes.
  template <class T>
  static void store_n(T* p, V a, int n) {
    for (int l = 0; l < n; ++l) from_f32(a.v[l], p + l);
  }
  // No portable streaming store: an ordinary one.
  template <class T>
  static void stream(T* p, V a) {
    store(p, a);
  }
  static void fence() {}
};

#endif

}  // namespace
}  // namespace opbridge
