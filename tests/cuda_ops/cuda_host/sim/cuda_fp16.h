// Host stand-in for CUDA's half type (tests only): storage and round-to-nearest-even conversions,
// with opbridge's own exact conversions (opbridge/dtype.h). See simt.h.
#pragma once
#include <cstdint>

#include "opbridge/dtype.h"
#include "simt.h"

struct __half {
  uint16_t x;
};
inline float __half2float(__half h) { return opbridge::half_to_float(h.x); }
inline __half __float2half_rn(float f) { return __half{opbridge::float_to_half(f)}; }
