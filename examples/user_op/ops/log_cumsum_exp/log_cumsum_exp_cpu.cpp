// LogCumSumExp CPU kernel and its compute function.
#include <algorithm>
#include <cmath>

#include "log_cumsum_exp.h"

namespace userops {

namespace {

// Scans one line of `len` elements `stride` apart.
template <class T>
void scan_line(const T* x, T* y, int64_t len, int64_t stride) {
  T m = -INFINITY;  // running maximum
  T s = 0;          // sum of exp(x - m) so far
  for (int64_t i = 0; i < len; ++i) {
    const T v = x[i * stride];
    if (v > m) {
      s = s * std::exp(m - v) + T(1);  // exp(-inf) = 0 for the first finite value
      m = v;
    } else if (v == m) {
      s += T(1);  // also +inf == +inf, where exp(v - m) would be exp(NaN)
    } else {
      s += std::exp(v - m);  // v < m, or NaN (which then propagates)
    }
    y[i * stride] = m + std::log(s);
  }
}

// Lines shorter than this are batched into one parallel task: a task should do at least a few
// microseconds of work (~16K exp/log evaluations) to be worth scheduling.
constexpr int64_t kMinTaskElems = 1 << 14;

// x and y: contiguous [outer, len, inner]; y does not alias x.
template <class T>
void scan(const T* x, T* y, const ScanDims& d, const opbridge::ParallelFor& pf) {
  const int64_t lines = d.outer * d.inner;
  const int64_t grain = std::max<int64_t>(1, kMinTaskElems / std::max<int64_t>(1, d.len));
  pf(lines, grain, [&](int64_t begin, int64_t end) {
    for (int64_t l = begin; l < end; ++l) {
      const int64_t o = l / d.inner, k = l % d.inner;
      const int64_t base = o * d.len * d.inner + k;
      scan_line(x + base, y + base, d.len, d.inner);
    }
  });
}

opbridge::Status compute(const opbridge::KernelCall& k) {
  const ScanDims d = log_cumsum_exp_dims(k);
  return opbridge::dispatch<float, double>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    scan<T>(k.in<T>("x"), k.out<T>(0), d, k.parallel());
    return opbridge::Status::Ok();
  });
}

}  // namespace

OPBRIDGE_KERNEL(log_cumsum_exp_decl, kCpu, compute);

}  // namespace userops
