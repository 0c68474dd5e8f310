// CPU kernels of shapes::segment_sum (see segment_sum.h): framework-free, shared by the torch and ORT ops.
#include <algorithm>

#include "segment_sum.h"

namespace shapes {

template <class T>
opbridge::Status segment_sum_cpu(const T* values, const int64_t* ids, T* y, const SegmentSumDims& d,
                                 const opbridge::ParallelFor& pf) {
  const int64_t D = d.channels;  // ids: checked by the declaration (host_memory)
  // A task per range of columns: no two tasks write one element.
  pf(D, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.rows)), [&](int64_t begin, int64_t end) {
    for (int64_t s = 0; s < d.segments; ++s) std::fill(y + s * D + begin, y + s * D + end, T(0));
    for (int64_t i = 0; i < d.rows; ++i) {
      for (int64_t c = begin; c < end; ++c) y[ids[i] * D + c] += values[i * D + c];
    }
  });
  return opbridge::Status::Ok();
}

template <class T>
opbridge::Status segment_sum_backward_cpu(const T* grad, const int64_t* ids, T* grad_values, const SegmentSumDims& d,
                                          const opbridge::ParallelFor& pf) {
  pf(d.rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.channels)), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) std::copy_n(grad + ids[i] * d.channels, d.channels, grad_values + i * d.channels);
  });
  return opbridge::Status::Ok();
}

// The element types the declaration allows (kFloat32And64).
#define SHAPES_SEGMENT_SUM_INSTANTIATE(T)                                                                          \
  template opbridge::Status segment_sum_cpu<T>(const T*, const int64_t*, T*, const SegmentSumDims&,            \
                                               const opbridge::ParallelFor&);                                  \
  template opbridge::Status segment_sum_backward_cpu<T>(const T*, const int64_t*, T*, const SegmentSumDims&,  \
                                                        const opbridge::ParallelFor&);
SHAPES_SEGMENT_SUM_INSTANTIATE(float)
SHAPES_SEGMENT_SUM_INSTANTIATE(double)

}  // namespace shapes
