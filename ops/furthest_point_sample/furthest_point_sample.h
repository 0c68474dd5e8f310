// opbridge FurthestPointSample: iterative farthest point sampling (PointNet++), mmcv's
// furthest_point_sample.
//
// points_xyz [B, N, 3], num_points = M <= N -> indices [B, M] int64. indices[b, 0] = 0; each
// later index is the point whose squared distance to the points picked so far (the smallest
// over them) is the largest; ties go to the lowest index. Distances are computed in float
// (double for float64 points) as ((dx * dx + dy * dy) + dz * dz), with no fused multiply-add,
// in every kernel, so the CPU and CUDA kernels pick the same indices. A distance that is NaN
// (a point with a NaN coordinate) counts as +infinity: such a point never gets closer, so it is
// picked as soon as it is the farthest (the first of them at once, after index 0), and every
// index stays in [0, N).
#pragma once

#include <cstdint>

#include "opbridge/cpu_isa.h"
#include "opbridge/parallel.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge {

inline constexpr const char* kFurthestPointSampleOpType = "FurthestPointSample";

const OpDecl& furthest_point_sample_decl();

// B, N of points_xyz; M = num_points.
using FurthestPointSampleParams = point_cloud::CloudDims;
FurthestPointSampleParams furthest_point_sample_params(const KernelCall& k);

// points: [B, N, 3] contiguous; out: [B, M]. T: float, double, Half, BFloat16 (the 16-bit types
// are computed in float). Extra memory: 4 N values of the compute type per batch item in flight.
// isa: the instruction-set variant of the hot loop (kAuto: the process-wide level); every
// variant gives the same indices.
template <class T>
Status furthest_point_sample_cpu(const T* points, int64_t* out, const FurthestPointSampleParams& p,
                                 const ParallelFor& pf, CpuIsa isa = CpuIsa::kAuto);

}  // namespace opbridge
