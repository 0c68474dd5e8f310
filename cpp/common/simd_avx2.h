// opbridge: 8 float lanes in an AVX2 register, for kernels compiled with the AVX2 flags
// (cmake/opbridge_ops.cmake: <op>_cpu_isa.cpp, common/simd_isa.h). Interface and linkage as simd_avx512.h.
#pragma once

#if !defined(__AVX2__) || !defined(__F16C__) || !defined(__FMA__)
#error "simd_avx2.h needs -mavx2 -mf16c -mfma"
#endif

#include <immintrin.h>

#include <cstdint>

#include "opbridge/dtype.h"

namespace opbridge {
namespace {

struct SimdAvx2 {
  static constexpr int W = 8;
  using V = __m256;

  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float a) { return _mm256_set1_ps(a); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V round(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V pow2(V n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  // n within pow2's range (the interface's): one product.
  static V scalef(V p, V n) { return mul(p, pow2(n)); }
  static V sub_n(V a, V b, int n) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes));
    return _mm256_and_ps(_mm256_sub_ps(a, b), keep);
  }
  static double hsum(V a) {
    const __m256d s = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(a)),
                                    _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
    const __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
  }
  static void hsum_w(const V* v, double* out) {
    V t[4], u[2];
    for (int j = 0; j < 4; ++j) {
      const V a = v[2 * j], b = v[2 * j + 1];
      t[j] = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    }
    for (int j = 0; j < 2; ++j) {
      const __m256d a = _mm256_castps_pd(t[2 * j]), b = _mm256_castps_pd(t[2 * j + 1]);
      u[j] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    // u[j]: (vectors 4j..4j+3 over the low 128 bits; over the high 128 bits)
    const V s = _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
    _mm256_storeu_pd(out, _mm256_cvtps_pd(_mm256_castps256_ps128(s)));
    _mm256_storeu_pd(out + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(s, 1)));
  }

  static float to_f32(float v) { return v; }
  static float to_f32(Half v) { return _cvtsh_ss(v.bits); }
  static float to_f32(BFloat16 v) {
    const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
    return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(static_cast<int>(u))));
  }

  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V load(const BFloat16* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void store(float* p, V a) { _mm256_storeu_ps(p, a); }
  static void store(Half* p, V a) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store(BFloat16* p, V a) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16(a)); }
  static void stream(float* p, V a) { _mm256_stream_ps(p, a); }
  static void stream(Half* p, V a) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void stream(BFloat16* p, V a) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_bf16(a)); }
  static void fence() { _mm_sfence(); }

  // The first n < W floats with AVX2's masked moves (lanes from n on: read as 0, never written,
  // never fault). Through a stack buffer, as the 16-bit types below, each masked load waited for
  // the buffer's scalar stores to reach the cache (a vector load over several smaller stores
  // cannot take their data from the store queue).
  static V load_n(const float* p, int n) { return _mm256_maskload_ps(p, lanes_below(n)); }
  static void store_n(float* p, V a, int n) { _mm256_maskstore_ps(p, lanes_below(n), a); }
  // AVX2 has no 16-bit masked loads/stores: go through a small stack buffer.
  template <class T>
  static V load_n(const T* p, int n) {
    T buf[W] = {};
    for (int l = 0; l < n; ++l) buf[l] = p[l];
    return load(buf);
  }
  template <class T>
  static void store_n(T* p, V a, int n) {
    T buf[W];
    store(buf, a);
    for (int l = 0; l < n; ++l) p[l] = buf[l];
  }

 private:
  static __m256i lanes_below(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  // As SimdAvx512::to_bf16, on 8 lanes.
  static __m128i to_bf16(V a) {
    const __m256i u = _mm256_castps_si256(a);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    // |u| <= 0x7fffffff, so the signed compare is an unsigned one here.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
    // Every lane is <= 0xffff, so the saturating pack is exact; it interleaves 128-bit halves,
    // and the permute gathers lanes 0-3 and 4-7 into the low half.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return _mm256_castsi256_si128(packed);
  }
};

}  // namespace
}  // namespace opbridge
