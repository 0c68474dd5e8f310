// CPU kernels of shapes::select_rows and their compute function (see select_rows.h).
#include <algorithm>
#include <vector>

#include "select_rows.h"

namespace shapes {
namespace {

using opbridge::KernelCall;
using opbridge::Status;

// The kernel in two steps, as y's size is known only after the first: marks the rows of x
// [rows, channels] to keep in keep[rows] and returns their count ...
template <class T>
int64_t count(const T* x, uint8_t* keep, const SelectRowsParams& p) {
  const int64_t C = p.channels;
  int64_t n = 0;
  for (int64_t r = 0; r < p.rows; ++r) {
    keep[r] = C > 0 && *std::max_element(x + r * C, x + (r + 1) * C) > p.threshold;
    n += keep[r];
  }
  return n;
}

// ... then copies them to y [count, channels].
template <class T>
void copy(const T* x, const uint8_t* keep, T* y, const SelectRowsParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    if (keep[r]) y = std::copy_n(x + r * p.channels, p.channels, y);
  }
}

// The compute function: counts the rows, then allocates y ("?" in its rule) with k.out(0, shape).
Status forward_cpu(const KernelCall& k) {
  const SelectRowsParams p = select_rows_params(k);
  std::vector<uint8_t> keep(static_cast<size_t>(p.rows));
  return opbridge::dispatch<float, double>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = count<T>(k.in<T>("x"), keep.data(), p);
    copy<T>(k.in<T>("x"), keep.data(), k.out<T>(0, {n, p.channels}), p);
    return Status::Ok();
  });
}

}  // namespace

OPBRIDGE_KERNEL(select_rows_decl, kCpu, forward_cpu);

}  // namespace shapes
