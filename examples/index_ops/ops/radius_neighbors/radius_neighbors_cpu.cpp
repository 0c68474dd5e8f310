// CPU kernels of index_ops::radius_neighbors and their compute functions (see radius_neighbors.h).
#include <algorithm>

#include "radius_neighbors.h"

namespace index_ops {
namespace {

using opbridge::KernelCall;
using opbridge::ParallelFor;
using opbridge::Status;

// Rows per task: enough work (~16k elements) to be worth a task of the caller's thread pool.
int64_t grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n)); }

// points: [points, dims]; queries: [queries, dims]; indices: [queries, k]. Distances in double.
template <class T>
void forward(const T* points, const T* queries, int64_t* indices, const RadiusNeighborsParams& p,
             const ParallelFor& pf) {
  const double r2 = p.radius * p.radius;
  pf(p.queries, grain(p.points * p.dims), [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q) {
      int64_t* out = indices + q * p.k;
      int64_t found = 0;
      for (int64_t i = 0; i < p.points && found < p.k; ++i) {
        double d2 = 0;
        for (int64_t c = 0; c < p.dims; ++c) {
          const double d = static_cast<double>(points[i * p.dims + c]) - static_cast<double>(queries[q * p.dims + c]);
          d2 += d * d;
        }
        if (d2 < r2) out[found++] = i;
      }
      std::fill(out + found, out + p.k, int64_t{-1});
    }
  });
}

// The compute functions: the checked call's tensors (contiguous, outputs allocated from the
// declaration's rules) into the kernels, for the element types the declaration allows.
Status forward_cpu(const KernelCall& k) {
  const RadiusNeighborsParams p = radius_neighbors_params(k);
  return opbridge::dispatch<float, double>(k.type("points"), [&](auto tag) {
    using T = decltype(tag);
    forward<T>(k.in<T>("points"), k.in<T>("queries"), k.out<int64_t>(0), p, k.parallel());
    return Status::Ok();
  });
}

}  // namespace

OPBRIDGE_KERNEL(radius_neighbors_decl, kCpu, forward_cpu);

}  // namespace index_ops
