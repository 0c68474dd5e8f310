// opbridge: 16 float lanes in an AVX-512 register, for kernels compiled with the AVX-512 flags
// (cmake/opbridge_ops.cmake: <op>_cpu_isa.cpp, common/simd_isa.h).
//
// Interface shared with simd_generic.h and simd_avx2.h, which kernels are templated on:
//   W                        lanes per vector; V the vector type
//   zero, set1, add, sub, fmadd(a, b, c) = a * b + c, sub_n (a - b in the first n lanes, 0 after)
//   mul, div, min, max       min/max(a, b) return b where either is NaN (as minps/maxps do)
//   round(v)                 to the nearest integer (ties to even), as float
//   pow2(n)                  2^n for integral n in [-126, 128] (built from the exponent bits;
//                            2^128 is inf)
//   scalef(p, n)             p * 2^n for integral n in [-126, 128] and finite p in [0.5, 2):
//                            2^128 overflows to inf, as the exact product would
//   hsum(v)                  the lanes' sum, added in double
//   hsum_w(v, out)           out[j] = the lanes' sum of v[j] for the W vectors v[0..W), added in
//                            float (a tree of W - 1 additions per vector) and widened to double: a
//                            transposed reduction, about a fifth of W hsums' instructions, for
//                            lanes that each hold a short sum
//   load / store(T*)         W elements of T (float, Half, BFloat16) <-> float lanes
//   load_n / store_n(T*, n)  the first n < W elements (other lanes read as 0, never touched)
//   to_f32(T)                one element to float
//   stream(T*, v)            store bypassing the caches (non-temporal); p aligned to W * sizeof(T)
//   fence()                  orders earlier streaming stores before later stores (call before
//                            other threads may read what was streamed)
// 16-bit conversions round to nearest even and match dtype.h bit for bit (NaN stays NaN).
//
// Everything has internal linkage (anonymous namespace): this code exists once per instruction
// set, and an inline function emitted by a TU built with -mavx512f must never be the copy the
// linker keeps for code that runs on older CPUs.
#pragma once

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512DQ__) || \
    !defined(__F16C__) || !defined(__FMA__)
#error "simd_avx512.h needs -mavx512f -mavx512bw -mavx512vl -mavx512dq -mf16c -mfma"
#endif

#include <immintrin.h>

#include <cstdint>

#include "opbridge/dtype.h"

namespace opbridge {
namespace {

struct SimdAvx512 {
  static constexpr int W = 16;
  using V = __m512;

  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V sub_n(V a, V b, int n) { return _mm512_maskz_sub_ps(mask(n), a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V round(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V scalef(V p, V n) { return _mm512_scalef_ps(p, n); }
  static V pow2(V n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static double hsum(V a) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(a));
    const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(a, 1));
    return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
  }
  static void hsum_w(const V* v, double* out) {
    // Each step adds pairs of vectors lane-shuffled so that one result holds partial sums of
    // twice as many input vectors, until one vector holds the 16 sums in order.
    V t[8], u[4], w[2];
    for (int j = 0; j < 8; ++j) {
      const V a = v[2 * j], b = v[2 * j + 1];
      // per block: (a0 + a2, b0 + b2, a1 + a3, b1 + b3)
      t[j] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    for (int j = 0; j < 4; ++j) {
      const __m512d a = _mm512_castps_pd(t[2 * j]), b = _mm512_castps_pd(t[2 * j + 1]);
      // per block: the block's sums of vectors 4j .. 4j + 3
      u[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int j = 0; j < 2; ++j) {
      // blocks: (vectors 8j..8j+3 over blocks 0+1, over 2+3; 8j+4..8j+7 over 0+1, over 2+3)
      w[j] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    }
    const V s = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
    _mm512_storeu_pd(out, _mm512_cvtps_pd(_mm512_castps512_ps256(s)));
    _mm512_storeu_pd(out + 8, _mm512_cvtps_pd(_mm512_extractf32x8_ps(s, 1)));
  }

  static float to_f32(float v) { return v; }
  static float to_f32(Half v) { return _cvtsh_ss(v.bits); }
  static float to_f32(BFloat16 v) {
    const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
    return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(static_cast<int>(u))));
  }

  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V load(const BFloat16* p) {
    return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static V load_n(const Half* p, int n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask(n), p)); }
  static V load_n(const BFloat16* p, int n) { return widen_bf16(_mm256_maskz_loadu_epi16(mask(n), p)); }

  static void store(float* p, V a) { _mm512_storeu_ps(p, a); }
  static void store(Half* p, V a) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_half(a)); }
  static void store(BFloat16* p, V a) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(a)); }
  static void stream(float* p, V a) { _mm512_stream_ps(p, a); }
  static void stream(Half* p, V a) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_half(a)); }
  static void stream(BFloat16* p, V a) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_bf16(a)); }
  static void fence() { _mm_sfence(); }
  static void store_n(float* p, V a, int n) { _mm512_mask_storeu_ps(p, mask(n), a); }
  static void store_n(Half* p, V a, int n) { _mm256_mask_storeu_epi16(p, mask(n), to_half(a)); }
  static void store_n(BFloat16* p, V a, int n) { _mm256_mask_storeu_epi16(p, mask(n), to_bf16(a)); }

 private:
  static __mmask16 mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static V widen_bf16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m256i to_half(V a) { return _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // Round to nearest even on the bits (as dtype.h's float_to_bf16); NaN -> quiet NaN. Not
  // vcvtneps2bf16: it flushes subnormals to zero.
  static __m256i to_bf16(V a) {
    const __m512i u = _mm512_castps_si512(a);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
  }
};

}  // namespace
}  // namespace opbridge
