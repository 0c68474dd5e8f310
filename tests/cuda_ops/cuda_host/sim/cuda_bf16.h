// Host stand-in for CUDA's bfloat16 type (tests only): see cuda_fp16.h.
#pragma once
#include <cstdint>

#include "opbridge/dtype.h"
#include "simt.h"

struct __nv_bfloat16 {
  uint16_t x;
};
inline float __bfloat162float(__nv_bfloat16 h) { return opbridge::bf16_to_float(h.x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{opbridge::float_to_bf16(f)}; }
