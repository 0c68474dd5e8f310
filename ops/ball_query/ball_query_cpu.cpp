// BallQuery CPU kernel (framework-free) and its compute function: one pass over the points per
// center, stopping once sample_num points are found; centers run in parallel.
#include <algorithm>
#include <cstdint>

#include "ball_query.h"
#include "opbridge/dtype.h"
#include "opbridge/point_cloud.h"

OPBRIDGE_NO_FP_CONTRACT_BEGIN
namespace opbridge {

template <class T>
Status ball_query_cpu(const T* xyz, const T* centers, int64_t* out, const BallQueryParams& p, const ParallelFor& pf) {
  using C = point_cloud::dist_t<T>;
  if (p.B == 0 || p.M == 0) return Status::Ok();
  const C lo2 = static_cast<C>(p.min_radius) * static_cast<C>(p.min_radius);
  const C hi2 = static_cast<C>(p.max_radius) * static_cast<C>(p.max_radius);
  pf(p.B * p.M, point_cloud::query_grain(p.N), [&](int64_t begin, int64_t end) {
    for (int64_t bm = begin; bm < end; ++bm) {
      const int64_t b = bm / p.M;
      const T* pts = xyz + b * p.N * 3;
      const C cx = to_float(centers[bm * 3]), cy = to_float(centers[bm * 3 + 1]), cz = to_float(centers[bm * 3 + 2]);
      int64_t* o = out + bm * p.S;
      int64_t count = 0;
      for (int64_t k = 0; k < p.N && count < p.S; ++k) {
        const C dx = static_cast<C>(to_float(pts[3 * k])) - cx, dy = static_cast<C>(to_float(pts[3 * k + 1])) - cy,
                dz = static_cast<C>(to_float(pts[3 * k + 2])) - cz;
        const C d2 = point_cloud::squared_distance(dx, dy, dz);
        if (d2 == 0 || (d2 >= lo2 && d2 < hi2)) {
          if (count == 0) std::fill(o, o + p.S, k);
          o[count++] = k;
        }
      }
      if (count == 0) std::fill(o, o + p.S, int64_t{0});
    }
  });
  return Status::Ok();
}

#define OPBRIDGE_INSTANTIATE_BALL_QUERY(T) \
  template Status ball_query_cpu<T>(const T*, const T*, int64_t*, const BallQueryParams&, const ParallelFor&);
OPBRIDGE_FOR_EACH_FLOAT_TYPE(OPBRIDGE_INSTANTIATE_BALL_QUERY)
#undef OPBRIDGE_INSTANTIATE_BALL_QUERY

namespace {

Status compute(const KernelCall& k) {
  const BallQueryParams p = ball_query_params(k);
  return dispatch<float, double, Half, BFloat16>(k.type("xyz"), [&](auto tag) {
    using T = decltype(tag);
    return ball_query_cpu<T>(k.in<T>("xyz"), k.in<T>("center_xyz"), k.out<int64_t>(0), p, k.parallel());
  });
}

}  // namespace

OPBRIDGE_KERNEL(ball_query_decl, kCpu, compute);

}  // namespace opbridge
OPBRIDGE_NO_FP_CONTRACT_END
