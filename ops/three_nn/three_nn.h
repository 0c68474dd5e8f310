// opbridge ThreeNN: the three nearest source points of each target point (PointNet++'s feature
// propagation; mmcv's three_nn).
//
// target [B, N, 3], source [B, M, 3] (M >= 3) -> dist [B, N, 3] (Euclidean distances, ascending)
// and indices [B, N, 3] int64 into M. Squared distances are ((dx * dx + dy * dy) + dz * dz) in
// float (double for float64), with no fused multiply-add; ties go to the lowest index; a NaN
// distance counts as +infinity (ranked after every other point, the lowest index first), so every
// index is in [0, M) and such a neighbour's distance is +inf.
#pragma once

#include <cstdint>

#include "opbridge/parallel.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge {

inline constexpr const char* kThreeNNOpType = "ThreeNN";

const OpDecl& three_nn_decl();

using ThreeNNParams = point_cloud::CloudDims;
ThreeNNParams three_nn_params(const KernelCall& k);

// target [B, N, 3], source [B, M, 3] -> dist [B, N, 3], indices [B, N, 3]. T: float, double,
// Half, BFloat16.
template <class T>
Status three_nn_cpu(const T* target, const T* source, T* dist, int64_t* indices, const ThreeNNParams& p,
                    const ParallelFor& pf);

}  // namespace opbridge
