// KNN CPU kernel (framework-free) and its compute function. Per center, one pass over the points
// keeps the k best in a sorted list (insertion: k is small in practice); a point enters only when
// strictly nearer than the k-th, so equal distances keep the lower index first. Centers run in
// parallel.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "knn.h"
#include "opbridge/dtype.h"

namespace opbridge {

template <class T>
Status knn_cpu(const T* xyz, const T* centers, int64_t* out, const KnnParams& p, const ParallelFor& pf) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  if (p.B == 0 || p.M == 0) return Status::Ok();
  const C inf = std::numeric_limits<C>::infinity();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, p.N));
  pf(p.B * p.M, grain, [&](int64_t begin, int64_t end) {
    std::vector<C> best_d(p.K);
    std::vector<int64_t> best_i(p.K);
    for (int64_t bm = begin; bm < end; ++bm) {
      const int64_t b = bm / p.M, m = bm % p.M;
      const T* pts = xyz + b * p.N * 3;
      const C cx = to_float(centers[bm * 3]), cy = to_float(centers[bm * 3 + 1]), cz = to_float(centers[bm * 3 + 2]);
      int64_t filled = 0;
      for (int64_t i = 0; i < p.N; ++i) {
        const C dx = static_cast<C>(to_float(pts[3 * i])) - cx, dy = static_cast<C>(to_float(pts[3 * i + 1])) - cy,
                dz = static_cast<C>(to_float(pts[3 * i + 2])) - cz;
        C d = (dx * dx + dy * dy) + dz * dz;
        if (std::isnan(d)) d = inf;
        if (filled == p.K && !(d < best_d[p.K - 1])) continue;
        int64_t at = filled < p.K ? filled++ : p.K - 1;
        while (at > 0 && d < best_d[at - 1]) {
          best_d[at] = best_d[at - 1];
          best_i[at] = best_i[at - 1];
          --at;
        }
        best_d[at] = d;
        best_i[at] = i;
      }
      int64_t* o = out + b * p.K * p.M + m;
      for (int64_t j = 0; j < p.K; ++j) o[j * p.M] = best_i[j];
    }
  });
  return Status::Ok();
}

template Status knn_cpu<float>(const float*, const float*, int64_t*, const KnnParams&, const ParallelFor&);
template Status knn_cpu<double>(const double*, const double*, int64_t*, const KnnParams&, const ParallelFor&);
template Status knn_cpu<Half>(const Half*, const Half*, int64_t*, const KnnParams&, const ParallelFor&);
template Status knn_cpu<BFloat16>(const BFloat16*, const BFloat16*, int64_t*, const KnnParams&, const ParallelFor&);

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
