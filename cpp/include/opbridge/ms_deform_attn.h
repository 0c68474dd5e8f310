// opbridge MultiScaleDeformableAttention: the sizes shared by the CPU and CUDA kernels.
#pragma once

#include <cstdint>

namespace opbridge {

inline constexpr int64_t kMsDeformAttnMaxLevels = 16;   // levels are passed by value to CUDA kernels
struct MsDeformAttnDims { int64_t N = 0, S = 0, M = 0, D = 0, Lq = 0, L = 0, P = 0; };

}  // namespace opbridge
