// opbridge: element types shared by the kernels, independent of any framework.
//
// Half and BFloat16 are 16-bit storage types, bit-compatible with at::Half / at::BFloat16,
// Ort::Float16_t / Ort::BFloat16_t and CUDA's __half / __nv_bfloat16, so adapters can
// reinterpret their pointers. Arithmetic happens in float (see acc_t).
#pragma once

#include <cstdint>
#include <cstring>

namespace opbridge {

enum class DType { kFloat32, kFloat64, kFloat16, kBFloat16 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// Expands M(T) for each floating-point element type, in DType's order: one line for the explicit
// instantiations of a kernel written for all four.
#define OPBRIDGE_FOR_EACH_FLOAT_TYPE(M) M(float) M(double) M(::opbridge::Half) M(::opbridge::BFloat16)

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// IEEE binary16 -> binary32, exact (handles subnormals, inf, NaN).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    // Subnormal: value = mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// binary32 -> binary16 with round-to-nearest-even; overflow gives inf, NaN stays NaN.
inline uint16_t float_to_half(float f) {
  const uint32_t x = float_to_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {
    // Result is subnormal or zero: count in units of 2^-24 (scaling by 2^24 is exact), then
    // round to nearest even by hand.
    const float r = bits_to_float(ax) * 16777216.0f;  // in units of 2^-24, < 1024
    uint32_t q = static_cast<uint32_t>(r);
    const float frac = r - static_cast<float>(q);
    if (frac > 0.5f || (frac == 0.5f && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t h = ((ax - 0x38000000u) >> 13);
  const uint32_t rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float bf16_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

// binary32 -> bfloat16 with round-to-nearest-even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  const uint32_t x = float_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

// Accumulation type: float for the 16-bit types, the type itself otherwise.
template <class T> struct AccType { using type = T; };
template <> struct AccType<Half> { using type = float; };
template <> struct AccType<BFloat16> { using type = float; };
template <class T> using acc_t = typename AccType<T>::type;

inline float to_float(Half h) { return half_to_float(h.bits); }
inline float to_float(BFloat16 b) { return bf16_to_float(b.bits); }
inline float to_float(float f) { return f; }
inline double to_float(double d) { return d; }

template <class T> inline T from_acc(acc_t<T> v) { return static_cast<T>(v); }
template <> inline Half from_acc<Half>(float v) { return Half{float_to_half(v)}; }
template <> inline BFloat16 from_acc<BFloat16>(float v) { return BFloat16{float_to_bf16(v)}; }

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <> constexpr DType dtype_of<double>() { return DType::kFloat64; }
template <> constexpr DType dtype_of<Half>() { return DType::kFloat16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::kBFloat16; }

}  // namespace opbridge
