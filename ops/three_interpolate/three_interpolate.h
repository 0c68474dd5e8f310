// opbridge ThreeInterpolate: weighted sum of three features per point (PointNet++'s feature
// propagation; mmcv's three_interpolate), and its backward.
//
// features [B, C, M], indices [B, N, 3] (int64 or int32, into M), weight [B, N, 3]
//   -> out [B, C, N], out[b, c, n] = (w0 * f[i0] + w1 * f[i1]) + w2 * f[i2]
// (in float for the 16-bit types). An index outside [0, M) is an error naming it on the CPU; the
// CUDA kernels cannot report it without synchronizing and take 0 for that feature instead.
// The backward gives the gradients of features (scatter-add) and of weight (mmcv gives none for
// weight).
#pragma once

#include <cstdint>

#include "opbridge/parallel.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge {

inline constexpr const char* kThreeInterpolateOpType = "ThreeInterpolate";

const OpDecl& three_interpolate_decl();
const OpDecl& three_interpolate_backward_decl();

struct ThreeInterpolateDims {
  int64_t B = 0, C = 0, M = 0, N = 0;
};
ThreeInterpolateDims three_interpolate_dims(const KernelCall& k);

// Indices must be in range (point_cloud::check_indices).
template <class T, class I>
void three_interpolate_cpu(const T* features, const I* indices, const T* weight, T* out, const ThreeInterpolateDims& d,
                           const ParallelFor& pf);
template <class T, class I>
void three_interpolate_backward_cpu(const T* grad_out, const T* features, const I* indices, const T* weight,
                                    T* grad_features, T* grad_weight, const ThreeInterpolateDims& d,
                                    const ParallelFor& pf);

}  // namespace opbridge
