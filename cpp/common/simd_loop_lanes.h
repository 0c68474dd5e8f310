// opbridge: W lanes of E in a plain array, worked on by fixed-length loops that the compiler
// vectorizes for the including TU's instruction set (kernel-internal header). The arithmetic
// shared by SimdGeneric's portable fallback (float lanes) and the float64 kernels' double lanes
// (F64Lanes, ms_deform_attn_simd.h). Internal linkage, as simd_avx512.h explains.
#pragma once

namespace opbridge {
namespace {

template <class E>
struct LoopLanes {
  // 8 lanes: one AVX-512 register of double, two AVX2 ones (or two SSE registers of float).
  static constexpr int W = 8;
  struct V {
    E v[W];
  };

  static V zero() { return set1(E(0)); }
  static V set1(E a) {
    V r;
    for (int l = 0; l < W; ++l) r.v[l] = a;
    return r;
  }
  static V add(V a, V b) {
    for (int l = 0; l < W; ++l) a.v[l] += b.v[l];
    return a;
  }
  // a * b + c
  static V fmadd(V a, V b, V c) {
    for (int l = 0; l < W; ++l) a.v[l] = a.v[l] * b.v[l] + c.v[l];
    return a;
  }
  static double hsum(V a) {
    double s = 0.0;
    for (int l = 0; l < W; ++l) s += static_cast<double>(a.v[l]);
    return s;
  }
};

}  // namespace
}  // namespace opbridge
