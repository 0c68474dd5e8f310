// ThreeNN CPU kernel (framework-free) and its compute function: one pass over the source points
// per target point, keeping the best three in registers; target points run in parallel.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "opbridge/dtype.h"
#include "three_nn.h"

namespace opbridge {

template <class T>
Status three_nn_cpu(const T* target, const T* source, T* dist, int64_t* indices, const ThreeNNParams& p,
                    const ParallelFor& pf) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  if (p.B == 0 || p.N == 0) return Status::Ok();
  const C inf = std::numeric_limits<C>::infinity();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, p.M));
  pf(p.B * p.N, grain, [&](int64_t begin, int64_t end) {
    for (int64_t bn = begin; bn < end; ++bn) {
      const T* src = source + (bn / p.N) * p.M * 3;
      const C tx = to_float(target[bn * 3]), ty = to_float(target[bn * 3 + 1]), tz = to_float(target[bn * 3 + 2]);
      // Slots start empty (index -1): any point fills one, a NaN distance as +inf.
      C d0 = inf, d1 = inf, d2 = inf;
      int64_t i0 = -1, i1 = -1, i2 = -1;
      for (int64_t k = 0; k < p.M; ++k) {
        const C dx = static_cast<C>(to_float(src[3 * k])) - tx, dy = static_cast<C>(to_float(src[3 * k + 1])) - ty,
                dz = static_cast<C>(to_float(src[3 * k + 2])) - tz;
        C d = (dx * dx + dy * dy) + dz * dz;
        if (std::isnan(d)) d = inf;
        if (i0 < 0 || d < d0) {
          d2 = d1, i2 = i1, d1 = d0, i1 = i0, d0 = d, i0 = k;
        } else if (i1 < 0 || d < d1) {
          d2 = d1, i2 = i1, d1 = d, i1 = k;
        } else if (i2 < 0 || d < d2) {
          d2 = d, i2 = k;
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

}  // namespace opbridge
