// opbridge GroupingOperation and GatherPoints: features gathered along their last axis by
// indices (PointNet++; mmcv's grouping_operation and gather_points), and their backwards.
//
//   grouping_operation(features [B, C, N], indices [B, M, S]) -> [B, C, M, S]
//   gather_points(features [B, C, N], indices [B, M])         -> [B, C, M]
//   out[b, c, j...] = features[b, c, indices[b, j...]]
// indices are int64 or int32 (mmcv's). An index outside [0, N) is an error naming it, in every
// CPU kernel (torch, ONNX Runtime); the CUDA kernels cannot report it without synchronizing and
// give 0 for it instead (its gradient is dropped). The backwards add each output's gradient into
// the features it came from (float accumulation for the 16-bit types).
#pragma once

#include <cstdint>

#include "opbridge/parallel.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge {

inline constexpr const char* kGroupingOperationOpType = "GroupingOperation";
inline constexpr const char* kGatherPointsOpType = "GatherPoints";

const OpDecl& grouping_operation_decl();
const OpDecl& grouping_operation_backward_decl();
const OpDecl& gather_points_decl();
const OpDecl& gather_points_backward_decl();

// Both ops as one: [B, C, N] features, [B, J] indices (J = M * S or M).
struct GatherDims {
  int64_t B = 0, C = 0, N = 0, J = 0;
};
GatherDims gather_dims(const KernelCall& k);

// out[b, c, j] = features[b, c, indices[b, j]]. Indices must be in range (point_cloud::check_indices).
template <class T, class I>
void gather_cpu(const T* features, const I* indices, T* out, const GatherDims& d, const ParallelFor& pf);
// grad_features = 0, then grad_features[b, c, indices[b, j]] += grad_out[b, c, j].
template <class T, class I>
void gather_backward_cpu(const T* grad_out, const I* indices, T* grad_features, const GatherDims& d,
                         const ParallelFor& pf);

}  // namespace opbridge
