// What the GroupNorm benchmark programs (group_norm_vs_floor.cpp, group_norm_ab.cpp) hand the
// kernels as their parallel-for, and how they summarize rounds.
#pragma once

#include <omp.h>
#include <opbridge/parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace omp_parallel_for {

// [0, n) in at most omp_get_max_threads() contiguous chunks of at least `grain`, one per thread,
// as torch's at::parallel_for splits a range (a ParallelFor runner: ParallelFor(omp_runner, nullptr)).
inline void omp_runner(void*, int64_t n, int64_t grain, opbridge::ParallelFor::Body body, void* ctx) {
  const int64_t tasks = std::min<int64_t>(omp_get_max_threads(), (n + grain - 1) / grain);
  const int64_t chunk = (n + tasks - 1) / tasks;
#pragma omp parallel num_threads(static_cast<int>(tasks))
  {
    const int64_t b = omp_get_thread_num() * chunk, e = std::min(n, b + chunk);
    if (b < e) body(ctx, b, e);
  }
}

// The median of v (the upper one for an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace omp_parallel_for
