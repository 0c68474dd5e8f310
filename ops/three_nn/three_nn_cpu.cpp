// ThreeNN CPU kernel (framework-free) and its compute function: one pass over the source points
// per target point, keeping the best three in registers; target points run in parallel.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "opbridge/dtype.h"
#include "three_nn.h"

// Distances must round alike on every device and instruction set: no fused multiply-adds.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
namespace opbridge {

namespace {

// Distances are computed a block of source points at a time from a structure-of-arrays copy of
// the source clouds (one vectorizable loop), then scanned for the best three (a branch that is
// rarely taken once three close points are found).
constexpr int64_t kBlock = 512;

}  // namespace

template <class T>
Status three_nn_cpu(const T* target, const T* source, T* dist, int64_t* indices, const ThreeNNParams& p,
                    const ParallelFor& pf) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  if (p.B == 0 || p.N == 0) return Status::Ok();
  const C inf = std::numeric_limits<C>::infinity();
  std::vector<C> soa(static_cast<size_t>(3 * p.B * p.M));
  pf(p.B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      C* x = soa.data() + 3 * b * p.M;
      for (int64_t k = 0; k < p.M; ++k) {
        const T* q = source + (b * p.M + k) * 3;
        x[k] = to_float(q[0]), x[p.M + k] = to_float(q[1]), x[2 * p.M + k] = to_float(q[2]);
      }
    }
  });
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, p.M));
  pf(p.B * p.N, grain, [&](int64_t begin, int64_t end) {
    C d[kBlock];
    for (int64_t bn = begin; bn < end; ++bn) {
      const C* __restrict sx = soa.data() + 3 * (bn / p.N) * p.M;
      const C* __restrict sy = sx + p.M;
      const C* __restrict sz = sy + p.M;
      const C tx = to_float(target[bn * 3]), ty = to_float(target[bn * 3 + 1]), tz = to_float(target[bn * 3 + 2]);
      // Slots start empty (index -1): any point fills one, a NaN distance as +inf.
      C d0 = inf, d1 = inf, d2 = inf;
      int64_t i0 = -1, i1 = -1, i2 = -1;
      for (int64_t k0 = 0; k0 < p.M; k0 += kBlock) {
        const int64_t len = std::min(kBlock, p.M - k0);
        for (int64_t j = 0; j < len; ++j) {
          const C dx = sx[k0 + j] - tx, dy = sy[k0 + j] - ty, dz = sz[k0 + j] - tz;
          d[j] = (dx * dx + dy * dy) + dz * dz;
        }
        for (int64_t j = 0; j < len; ++j) {
          C v = d[j];
          if (!(v < d2) && i2 >= 0) continue;  // the common case; NaN falls through
          if (std::isnan(v)) {
            if (i2 >= 0) continue;
            v = inf;
          }
          const int64_t k = k0 + j;
          if (i0 < 0 || v < d0) {
            d2 = d1, i2 = i1, d1 = d0, i1 = i0, d0 = v, i0 = k;
          } else if (i1 < 0 || v < d1) {
            d2 = d1, i2 = i1, d1 = v, i1 = k;
          } else if (i2 < 0 || v < d2) {
            d2 = v, i2 = k;
          }
        }
      }
      const C ds[3] = {d0, d1, d2};
      const int64_t is[3] = {i0, i1, i2};
      for (int j = 0; j < 3; ++j) {
        dist[bn * 3 + j] = from_acc<T>(static_cast<acc_t<T>>(std::sqrt(ds[j])));
        indices[bn * 3 + j] = is[j];
      }
    }
  });
  return Status::Ok();
}

template Status three_nn_cpu<float>(const float*, const float*, float*, int64_t*, const ThreeNNParams&, const ParallelFor&);
template Status three_nn_cpu<double>(const double*, const double*, double*, int64_t*, const ThreeNNParams&,
                                     const ParallelFor&);
template Status three_nn_cpu<Half>(const Half*, const Half*, Half*, int64_t*, const ThreeNNParams&, const ParallelFor&);
template Status three_nn_cpu<BFloat16>(const BFloat16*, const BFloat16*, BFloat16*, int64_t*, const ThreeNNParams&,
                                       const ParallelFor&);

namespace {

Status compute(const KernelCall& k) {
  const ThreeNNParams p = three_nn_params(k);
  return dispatch<float, double, Half, BFloat16>(k.type("target"), [&](auto tag) {
    using T = decltype(tag);
    return three_nn_cpu<T>(k.in<T>("target"), k.in<T>("source"), k.out<T>(0), k.out<int64_t>(1), p, k.parallel());
  });
}

}  // namespace

OPBRIDGE_KERNEL(three_nn_decl, kCpu, compute);

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
}  // namespace opbridge
