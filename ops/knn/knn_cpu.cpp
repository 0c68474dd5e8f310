// KNN CPU kernel (framework-free) and its compute function. Each cloud of enough finite points
// gets a uniform grid of cells (common/point_grid.h) searched outward from each center, so a
// center reads the points near it instead of all N; the rest (non-finite coordinates, small
// clouds, k near N) keep the full scan: per center, one pass over the points keeps the k best in
// a sorted list (insertion: k is small in practice); a point enters only when strictly nearer
// than the k-th, so equal distances keep the lower index first. Both rank by (distance, index)
// with the same distances, so they return the same indices. Centers run in parallel.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/point_grid.h"
#include "knn.h"
#include "opbridge/dtype.h"
#include "opbridge/point_cloud.h"

OPBRIDGE_NO_FP_CONTRACT_BEGIN
namespace opbridge {

// The scan: distances a block of points at a time from a structure-of-arrays copy of the clouds,
// then scanned against the k-th best so far (rarely inserted).
using point_cloud::kBlock;

template <class T>
Status knn_cpu(const T* xyz, const T* centers, int64_t* out, const KnnParams& p, const ParallelFor& pf) {
  using C = point_cloud::dist_t<T>;
  if (p.B == 0 || p.M == 0) return Status::Ok();
  const C inf = std::numeric_limits<C>::infinity();
  const point_cloud::CloudGrids<C> clouds(xyz, p.B, p.N, p.K, pf);
  pf(p.B * p.M, point_cloud::query_grain(p.N), [&](int64_t begin, int64_t end) {
    std::vector<C> best_d(p.K);
    std::vector<int64_t> best_i(p.K);
    point_cloud::NearestK<C> nearest{p.K, 0, best_d.data(), best_i.data()};
    C d[kBlock];
    for (int64_t bm = begin; bm < end; ++bm) {
      const int64_t b = bm / p.M, m = bm % p.M;
      const C* x = clouds.cloud(b);
      const C cx = to_float(centers[bm * 3]), cy = to_float(centers[bm * 3 + 1]), cz = to_float(centers[bm * 3 + 2]);
      if (!clouds.search(b, cx, cy, cz, nearest, d)) {
        int64_t filled = 0;
        C worst = inf;
        for (int64_t i0 = 0; i0 < p.N; i0 += kBlock) {
          const int64_t len = std::min(kBlock, p.N - i0);
          point_cloud::block_distances(x, p.N, i0, len, cx, cy, cz, d);
          for (int64_t j = 0; j < len; ++j) {
            C v = d[j];
            if (filled == p.K && !(v < worst)) continue;  // NaN counts as +inf: never nearer
            if (std::isnan(v)) v = inf;
            int64_t at = filled < p.K ? filled++ : p.K - 1;
            while (at > 0 && v < best_d[at - 1]) {
              best_d[at] = best_d[at - 1];
              best_i[at] = best_i[at - 1];
              --at;
            }
            best_d[at] = v;
            best_i[at] = i0 + j;
            worst = best_d[p.K - 1];
          }
        }
      }
      int64_t* o = out + b * p.K * p.M + m;
      for (int64_t j = 0; j < p.K; ++j) o[j * p.M] = best_i[j];
    }
  });
  return Status::Ok();
}

#define OPBRIDGE_INSTANTIATE_KNN(T) \
  template Status knn_cpu<T>(const T*, const T*, int64_t*, const KnnParams&, const ParallelFor&);
OPBRIDGE_FOR_EACH_FLOAT_TYPE(OPBRIDGE_INSTANTIATE_KNN)
#undef OPBRIDGE_INSTANTIATE_KNN

namespace {

Status compute(const KernelCall& k) {
  const KnnParams p = knn_params(k);
  return dispatch<float, double, Half, BFloat16>(k.type("xyz"), [&](auto tag) {
    using T = decltype(tag);
    return knn_cpu<T>(k.in<T>("xyz"), k.in<T>("center_xyz"), k.out<int64_t>(0), p, k.parallel());
  });
}

}  // namespace

OPBRIDGE_KERNEL(knn_decl, kCpu, compute);

}  // namespace opbridge
OPBRIDGE_NO_FP_CONTRACT_END
