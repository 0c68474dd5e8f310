// ThreeNN CPU kernel (framework-free) and its compute function. Each source cloud of enough
// finite points gets a uniform grid of cells (common/point_grid.h) searched outward from each
// target point; the rest (non-finite coordinates, small clouds) keep one pass over the source
// points per target point, keeping the best three in registers. Both rank by (distance, index)
// with the same distances, so they return the same neighbours. Target points run in parallel.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/point_grid.h"
#include "opbridge/dtype.h"
#include "opbridge/point_cloud.h"
#include "three_nn.h"
#include "three_nn_top3.h"

OPBRIDGE_NO_FP_CONTRACT_BEGIN
namespace opbridge {

// The scan: distances are computed a block of source points at a time from a structure-of-arrays
// copy of the source clouds, then scanned for the best three (a branch that is rarely taken once
// three close points are found).
using point_cloud::kBlock;

template <class T>
Status three_nn_cpu(const T* target, const T* source, T* dist, int64_t* indices, const ThreeNNParams& p,
                    const ParallelFor& pf) {
  using C = point_cloud::dist_t<T>;
  if (p.B == 0 || p.N == 0) return Status::Ok();
  const C inf = std::numeric_limits<C>::infinity();
  const point_cloud::CloudGrids<C> clouds(source, p.B, p.M, 3, pf);
  pf(p.B * p.N, point_cloud::query_grain(p.M), [&](int64_t begin, int64_t end) {
    C d[kBlock];
    C near_d[3];
    int64_t near_i[3];
    point_cloud::NearestK<C> nearest{3, 0, near_d, near_i};
    for (int64_t bn = begin; bn < end; ++bn) {
      const int64_t b = bn / p.N;
      const C* x = clouds.cloud(b);
      const C tx = to_float(target[bn * 3]), ty = to_float(target[bn * 3 + 1]), tz = to_float(target[bn * 3 + 2]);
      point_cloud::Top3<C> top(inf);
      if (clouds.search(b, tx, ty, tz, nearest, d)) {
        top.d0 = near_d[0], top.d1 = near_d[1], top.d2 = near_d[2];
        top.i0 = near_i[0], top.i1 = near_i[1], top.i2 = near_i[2];
      } else {
        for (int64_t k0 = 0; k0 < p.M; k0 += kBlock) {
          const int64_t len = std::min(kBlock, p.M - k0);
          point_cloud::block_distances(x, p.M, k0, len, tx, ty, tz, d);
          for (int64_t j = 0; j < len; ++j) top.offer(d[j], k0 + j);
        }
      }
      const C ds[3] = {top.d0, top.d1, top.d2};
      const int64_t is[3] = {top.i0, top.i1, top.i2};
      for (int j = 0; j < 3; ++j) {
        dist[bn * 3 + j] = from_acc<T>(static_cast<acc_t<T>>(std::sqrt(ds[j])));
        indices[bn * 3 + j] = is[j];
      }
    }
  });
  return Status::Ok();
}

#define OPBRIDGE_INSTANTIATE_THREE_NN(T) \
  template Status three_nn_cpu<T>(const T*, const T*, T*, int64_t*, const ThreeNNParams&, const ParallelFor&);
OPBRIDGE_FOR_EACH_FLOAT_TYPE(OPBRIDGE_INSTANTIATE_THREE_NN)
#undef OPBRIDGE_INSTANTIATE_THREE_NN

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
OPBRIDGE_NO_FP_CONTRACT_END
