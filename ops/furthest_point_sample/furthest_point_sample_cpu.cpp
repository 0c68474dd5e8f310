// FurthestPointSample CPU kernel (framework-free) and its compute function.
//
// Per batch item the points are copied once into structure-of-arrays form (x, y, z, and the
// running smallest distance), so that each of the M - 1 steps is one vectorizable pass that
// updates the distances and finds their maximum, and a short scan for its first index. Batch
// items run in parallel; a large cloud with few items splits every step into fixed blocks of
// points instead (the block maxima combine in order, so the result does not depend on the
// threads).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "furthest_point_sample.h"
#include "furthest_point_sample_isa.h"
#include "opbridge/cpu_isa.h"
#include "opbridge/dtype.h"

namespace opbridge {
namespace {

// From this many points, with fewer batch items than blocks of points, each step is split over
// the threads. A step then costs one parallel-for dispatch: a few microseconds on idle cores,
// milliseconds on oversubscribed ones (N = 100k on 2 busy vCPUs ran 20x slower split than on one
// thread), so only steps of ~100 us or more are split.
constexpr int64_t kSplitMinPoints = 262144;
constexpr int64_t kBlock = 65536;

template <class C>
struct Cloud {
  std::vector<C> x, y, z, dist;
  explicit Cloud(int64_t n) : x(n), y(n), z(n), dist(n, std::numeric_limits<C>::infinity()) {}
};

template <class T, class C>
void load(const T* p, int64_t n, Cloud<C>& c) {
  for (int64_t i = 0; i < n; ++i) {
    c.x[i] = static_cast<C>(to_float(p[3 * i]));
    c.y[i] = static_cast<C>(to_float(p[3 * i + 1]));
    c.z[i] = static_cast<C>(to_float(p[3 * i + 2]));
  }
}

// Updates dist[begin, end) with the distances to (px, py, pz) and returns the largest and the
// first index holding it. A NaN distance never replaces (counts as +inf), so dist is never NaN.
template <class C>
fps_isa::UpdateFn<C> update_for(CpuIsa isa) {
  switch (cpu_isa_resolve(isa)) {
#if defined(OPBRIDGE_X86_DISPATCH)
    case CpuIsa::kAvx512: return &fps_isa::update_avx512<C>;
    case CpuIsa::kAvx2: return &fps_isa::update_avx2<C>;
#endif
    default: return &fps_isa::update<C>;
  }
}

template <class T>
void sample_one(const T* p, int64_t n, int64_t m, int64_t* out, const ParallelFor* split, CpuIsa isa) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const fps_isa::UpdateFn<C> update = update_for<C>(isa);
  if (m == 0) return;
  Cloud<C> c(n);
  load(p, n, c);
  int64_t last = 0;
  out[0] = 0;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<std::pair<C, int64_t>> partial(split != nullptr ? blocks : 0);
  for (int64_t j = 1; j < m; ++j) {
    const C px = c.x[last], py = c.y[last], pz = c.z[last];
    if (split == nullptr) {
      last = update(c.x.data(), c.y.data(), c.z.data(), c.dist.data(), 0, n, px, py, pz).second;
    } else {
      (*split)(blocks, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          partial[b] = update(c.x.data(), c.y.data(), c.z.data(), c.dist.data(), b * kBlock,
                              std::min(n, (b + 1) * kBlock), px, py, pz);
        }
      });
      std::pair<C, int64_t> best = partial[0];
      for (int64_t b = 1; b < blocks; ++b) {
        if (partial[b].first > best.first) best = partial[b];
      }
      last = best.second;
    }
    out[j] = last;
  }
}

}  // namespace

template <class T>
Status furthest_point_sample_cpu(const T* points, int64_t* out, const FurthestPointSampleParams& p,
                                 const ParallelFor& pf, CpuIsa isa) {
  OPBRIDGE_RETURN_IF_ERROR(cpu_isa_check(isa));
  if (p.B == 0 || p.M == 0) return Status::Ok();
  const bool split = p.N >= kSplitMinPoints && p.B < (p.N + kBlock - 1) / kBlock;
  if (split) {
    for (int64_t b = 0; b < p.B; ++b) sample_one(points + b * p.N * 3, p.N, p.M, out + b * p.M, &pf, isa);
    return Status::Ok();
  }
  pf(p.B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) sample_one(points + b * p.N * 3, p.N, p.M, out + b * p.M, nullptr, isa);
  });
  return Status::Ok();
}

#define OPBRIDGE_INSTANTIATE_FPS(T)                                \
  template Status furthest_point_sample_cpu<T>(const T*, int64_t*, \
                                               const FurthestPointSampleParams&, const ParallelFor&, CpuIsa);
OPBRIDGE_FOR_EACH_FLOAT_TYPE(OPBRIDGE_INSTANTIATE_FPS)
#undef OPBRIDGE_INSTANTIATE_FPS

namespace {

Status compute(const KernelCall& k) {
  const FurthestPointSampleParams p = furthest_point_sample_params(k);
  return dispatch<float, double, Half, BFloat16>(k.type("points_xyz"), [&](auto tag) {
    using T = decltype(tag);
    return furthest_point_sample_cpu<T>(k.in<T>("points_xyz"), k.out<int64_t>(0), p, k.parallel(), k.isa());
  });
}

}  // namespace

OPBRIDGE_KERNEL(furthest_point_sample_decl, kCpu, compute);

}  // namespace opbridge
