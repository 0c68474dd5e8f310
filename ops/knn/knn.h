// opbridge KNN: the k nearest points of each center (mmcv's knn).
//
// xyz [B, N, 3], center_xyz [B, M, 3], 1 <= k <= N -> indices [B, k, M] int64 into N, nearest
// first (mmcv's layout). Squared distances are ((dx * dx + dy * dy) + dz * dz) in float (double
// for float64), with no fused multiply-add; ties go to the lowest index; a NaN distance counts
// as +infinity (ranked after every other point, the lowest index first), so every index is in
// [0, N). mmcv's center_xyz=None and transposed=True are the Python function's
// (opbridge.ops.knn): the op takes both clouds as (B, *, 3).
#pragma once

#include <cstdint>

#include "opbridge/parallel.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge {

inline constexpr const char* kKnnOpType = "KNN";

const OpDecl& knn_decl();

// B, N, M of the clouds; K = k.
struct KnnParams : point_cloud::CloudDims {
  int64_t K = 0;
};
KnnParams knn_params(const KernelCall& k);

template <class T>
Status knn_cpu(const T* xyz, const T* centers, int64_t* out, const KnnParams& p, const ParallelFor& pf);

}  // namespace opbridge
