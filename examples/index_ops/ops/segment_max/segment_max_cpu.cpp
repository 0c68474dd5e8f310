// CPU kernels of index_ops::segment_max and their compute functions (see segment_max.h).
#include <algorithm>

#include "segment_max.h"

namespace index_ops {
namespace {

using opbridge::KernelCall;
using opbridge::ParallelFor;
using opbridge::Status;

// Rows per task: enough work (~16k elements) to be worth a task of the caller's thread pool.
int64_t grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n)); }

// values: [rows, channels]; ids: [rows], each in [0, segments) (checked); y, argmax: [segments, channels].
// The first largest value wins; an empty segment gives y = 0, argmax = -1.
template <class T>
void forward(const T* values, const int64_t* ids, T* y, int64_t* argmax, const SegmentMaxParams& p,
             const ParallelFor& pf) {
  const int64_t D = p.channels;
  pf(D, grain(p.rows), [&](int64_t begin, int64_t end) {  // a task per range of columns
    for (int64_t s = 0; s < p.segments; ++s) std::fill(argmax + s * D + begin, argmax + s * D + end, -1);
    for (int64_t i = 0; i < p.rows; ++i) {
      for (int64_t c = begin, *a = argmax + ids[i] * D; c < end; ++c) {
        if (a[c] < 0 || values[i * D + c] > values[a[c] * D + c]) a[c] = i;
      }
    }
    for (int64_t s = 0; s < p.segments; ++s) {
      for (int64_t c = begin, *a = argmax + s * D; c < end; ++c) y[s * D + c] = a[c] < 0 ? T(0) : values[a[c] * D + c];
    }
  });
}

// grad_values[argmax[s, c], c] = grad[s, c]; zero elsewhere (each row wins its column at most once per segment).
template <class T>
void backward(const T* grad, const int64_t* argmax, T* grad_values, const SegmentMaxParams& p) {
  const int64_t D = p.channels;
  std::fill(grad_values, grad_values + p.rows * D, T(0));
  for (int64_t s = 0; s < p.segments * D; ++s) {
    if (argmax[s] >= 0) grad_values[argmax[s] * D + s % D] = grad[s];
  }
}

// The compute functions: the checked call's tensors (contiguous, outputs allocated from the
// declaration's rules) into the kernels, for the element types the declaration allows.
Status forward_cpu(const KernelCall& k) {
  const SegmentMaxParams p = segment_max_params(k);
  return opbridge::dispatch<float, double>(k.type("values"), [&](auto tag) {
    using T = decltype(tag);
    forward<T>(k.in<T>("values"), k.in<int64_t>("segment_ids"), k.out<T>(0), k.out<int64_t>(1), p, k.parallel());
    return Status::Ok();
  });
}

Status backward_cpu(const KernelCall& k) {
  const SegmentMaxParams p = segment_max_params(k);
  return opbridge::dispatch<float, double>(k.type("values"), [&](auto tag) {
    using T = decltype(tag);
    backward<T>(k.in<T>("grad"), k.in<int64_t>("argmax"), k.out<T>(0), p);
    return Status::Ok();
  });
}

}  // namespace

OPBRIDGE_KERNEL(segment_max_decl, kCpu, forward_cpu);
OPBRIDGE_KERNEL(segment_max_backward_decl, kCpu, backward_cpu);

}  // namespace index_ops
