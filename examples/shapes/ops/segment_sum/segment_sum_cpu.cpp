// CPU kernels of shapes::segment_sum and their compute functions (see segment_sum.h).
#include <algorithm>

#include "segment_sum.h"

namespace shapes {
namespace {

using opbridge::KernelCall;
using opbridge::ParallelFor;
using opbridge::Status;

// Rows (or columns) per task: enough work (~16k elements) to be worth a task of the caller's thread pool.
int64_t grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n)); }

// values: [rows, channels]; ids: [rows], each in [0, segments) (the declaration checks them);
// y: [segments, channels].
template <class T>
void forward(const T* values, const int64_t* ids, T* y, const SegmentSumParams& p, const ParallelFor& pf) {
  const int64_t D = p.channels;
  // A task per range of columns: no two tasks write one element.
  pf(D, grain(p.rows), [&](int64_t begin, int64_t end) {
    for (int64_t s = 0; s < p.segments; ++s) std::fill(y + s * D + begin, y + s * D + end, T(0));
    for (int64_t i = 0; i < p.rows; ++i) {
      for (int64_t c = begin; c < end; ++c) y[ids[i] * D + c] += values[i * D + c];
    }
  });
}

// grad_values[i] = grad[ids[i]].
template <class T>
void backward(const T* grad, const int64_t* ids, T* grad_values, const SegmentSumParams& p, const ParallelFor& pf) {
  const int64_t D = p.channels;
  pf(p.rows, grain(D), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) std::copy_n(grad + ids[i] * D, D, grad_values + i * D);
  });
}

// The compute functions: the checked call's tensors (contiguous, outputs allocated from the
// declaration's rules) into the kernels. segment_ids is host_memory(): its data is on the host.
Status forward_cpu(const KernelCall& k) {
  const SegmentSumParams p = segment_sum_params(k);
  return opbridge::dispatch<float, double>(k.type("values"), [&](auto tag) {
    using T = decltype(tag);
    forward<T>(k.in<T>("values"), k.in<int64_t>("segment_ids"), k.out<T>(0), p, k.parallel());
    return Status::Ok();
  });
}

Status backward_cpu(const KernelCall& k) {
  const SegmentSumParams p = segment_sum_params(k);
  return opbridge::dispatch<float, double>(k.type("values"), [&](auto tag) {
    using T = decltype(tag);
    backward<T>(k.in<T>("grad"), k.in<int64_t>("segment_ids"), k.out<T>(0), p, k.parallel());
    return Status::Ok();
  });
}

}  // namespace

OPBRIDGE_KERNEL(segment_sum_decl, kCpu, forward_cpu);
OPBRIDGE_KERNEL(segment_sum_backward_decl, kCpu, backward_cpu);

}  // namespace shapes
