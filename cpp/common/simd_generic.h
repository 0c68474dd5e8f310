// opbridge: portable "vector" of float lanes for kernels compiled for the baseline target.
//
// Same interface as simd_avx2.h / simd_avx512.h (see there); written as fixed-size loops that
// the compiler vectorizes for whatever the default target has (SSE2 on x86-64, NEON on arm64).
// Everything has internal linkage: see simd_avx512.h for why.
#pragma once

#include <cstdint>

#include "opbridge/dtype.h"

namespace opbridge {
namespace {

struct SimdGeneric {
  // 8 lanes: two SSE registers, so the per-lane partial sums of the kernels stay short.
  static constexpr int W = 8;
  struct V {
    float v[W];
  };

  static V zero() { return set1(0.f); }
  static V set1(float a) {
    V r;
    for (int l = 0; l < W; ++l) r.v[l] = a;
    return r;
  }
  static V add(V a, V b) {
    for (int l = 0; l < W; ++l) a.v[l] += b.v[l];
    return a;
  }
  static V sub(V a, V b) {
    for (int l = 0; l < W; ++l) a.v[l] -= b.v[l];
    return a;
  }
  // a * b + c
  static V fmadd(V a, V b, V c) {
    for (int l = 0; l < W; ++l) a.v[l] = a.v[l] * b.v[l] + c.v[l];
    return a;
  }
  // a - b in the first n lanes, 0 in the others.
  static V sub_n(V a, V b, int n) {
    for (int l = 0; l < W; ++l) a.v[l] = l < n ? a.v[l] - b.v[l] : 0.f;
    return a;
  }
  static double hsum(V a) {
    double s = 0.0;
    for (int l = 0; l < W; ++l) s += static_cast<double>(a.v[l]);
    return s;
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
};

}  // namespace
}  // namespace opbridge
