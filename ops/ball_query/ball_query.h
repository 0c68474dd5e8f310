// opbridge BallQuery: PointNet++'s ball query, mmcv's ball_query.
//
// xyz [B, N, 3] (the points), center_xyz [B, M, 3] (the query centers) -> indices
// [B, M, sample_num] int64: for each center, the first sample_num points (in index order) whose
// squared distance d2 satisfies d2 == 0 or min_radius^2 <= d2 < max_radius^2. Slots left
// unfilled repeat the first point found; a center with no point in its ball gets all zeros
// (mmcv's fill rule). Distances are ((dx * dx + dy * dy) + dz * dz) in float (double for
// float64), with no fused multiply-add; the radii are rounded to float32 first (as ONNX stores
// them) and squared in the compute type. A NaN distance counts as +infinity (never in a ball),
// so every index is in [0, N).
#pragma once

#include <cstdint>

#include "opbridge/parallel.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge {

inline constexpr const char* kBallQueryOpType = "BallQuery";

const OpDecl& ball_query_decl();

// B, N, M of the clouds; S = sample_num.
struct BallQueryParams : point_cloud::CloudDims {
  int64_t S = 0;
  float min_radius = 0, max_radius = 0;  // as float32, the ONNX attributes' type
};
BallQueryParams ball_query_params(const KernelCall& k);

// xyz [B, N, 3], centers [B, M, 3], out [B, M, S]; contiguous. T: float, double, Half, BFloat16.
template <class T>
Status ball_query_cpu(const T* xyz, const T* centers, int64_t* out, const BallQueryParams& p, const ParallelFor& pf);

}  // namespace opbridge
