// shapes::segment_sum: y[s] = the sum of the rows values[i] with segment_ids[i] == s, s < num_segments.
//
// The op's kernels, framework-free: raw pointers, sizes, the caller's thread pool, a Status.
// The torch op (segment_sum_torch.cpp) and the ORT op (segment_sum_ort.cpp) are thin adapters around them;
// the contract both follow (arguments, types, checks, output shapes) is the declaration in
// segment_sum_decl.cpp.
#pragma once

#include <cstdint>

#include <opbridge/op_decl.h>
#include <opbridge/parallel.h>
#include <opbridge/status.h>

namespace shapes {

// The op's declaration (opbridge/op_decl.h) and its backward's (torch autograd calls it).
const opbridge::OpDecl& segment_sum_decl();
const opbridge::OpDecl& segment_sum_backward_decl();

// values: [rows, channels] (rows = segment_ids' length); y: [num_segments, channels].
struct SegmentSumDims {
  int64_t rows = 0, channels = 0, segments = 0;
};
SegmentSumDims segment_sum_dims(const opbridge::OpCall& call);

// Forward (y fully written) and backward (grad_values[i] = grad[segment_ids[i]]). T: float or double.
// ids: in [0, segments) (the declaration checks them).
template <class T>
opbridge::Status segment_sum_cpu(const T* values, const int64_t* ids, T* y, const SegmentSumDims& d,
                                 const opbridge::ParallelFor& pf);
template <class T>
opbridge::Status segment_sum_backward_cpu(const T* grad, const int64_t* ids, T* grad_values, const SegmentSumDims& d,
                                          const opbridge::ParallelFor& pf);



}  // namespace shapes
