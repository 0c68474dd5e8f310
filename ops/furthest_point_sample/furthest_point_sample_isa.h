// FurthestPointSample's hot loop, compiled once per instruction set (furthest_point_sample_cpu_isa.cpp)
// and for the baseline (furthest_point_sample_cpu.cpp). No fused multiply-adds: every variant
// rounds as the others (and as the CUDA kernel), so all pick the same indices.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "opbridge/point_cloud.h"

OPBRIDGE_NO_FP_CONTRACT_BEGIN
namespace opbridge::fps_isa {

// Updates d[begin, end) with the squared distances of (x, y, z)[i] to (px, py, pz) where they are
// smaller (a NaN distance never replaces: it counts as +inf, so d is never NaN) and returns the
// largest d and the first index holding it. The maximum is taken over the distances' bit
// patterns: non-negative floats (and +inf) order like them, and an integer maximum vectorizes
// where a float one would not (IEEE semantics).
template <class C>
inline std::pair<C, int64_t> update(const C* __restrict x, const C* __restrict y, const C* __restrict z,
                                    C* __restrict d, int64_t begin, int64_t end, C px, C py, C pz) {
  using U = std::conditional_t<sizeof(C) == 4, uint32_t, uint64_t>;
  U best = 0;
  for (int64_t i = begin; i < end; ++i) {
    const C v = point_cloud::squared_distance(x[i] - px, y[i] - py, z[i] - pz);
    const C t = v < d[i] ? v : d[i];
    d[i] = t;
    U bits;
    std::memcpy(&bits, &t, sizeof bits);
    best = bits > best ? bits : best;
  }
  C value;
  std::memcpy(&value, &best, sizeof value);
  int64_t at = begin;
  while (d[at] != value) ++at;
  return {value, at};
}

template <class C>
using UpdateFn = std::pair<C, int64_t> (*)(const C*, const C*, const C*, C*, int64_t, int64_t, C, C, C);

template <class C> std::pair<C, int64_t> update_avx2(const C*, const C*, const C*, C*, int64_t, int64_t, C, C, C);
template <class C> std::pair<C, int64_t> update_avx512(const C*, const C*, const C*, C*, int64_t, int64_t, C, C, C);

}  // namespace opbridge::fps_isa
OPBRIDGE_NO_FP_CONTRACT_END
