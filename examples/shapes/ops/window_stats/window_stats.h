// shapes::window_stats: per window of `window` consecutive elements of each row of x, their sum and their
// sum of squares (two outputs of shape (N, L // window); a last partial window is left out).
//
// The op is its declaration and backward's (window_stats_decl.cpp), the function from a checked call to
// its kernels' arguments (window_stats_params, there too) and one compute function per device
// (window_stats_cpu.cpp). opbridge's generic adapters run the compute functions in torch, ONNX Runtime
// and opbridge._core: they check each call against the declaration, allocate the outputs from its
// rules and hand over contiguous tensors.
#pragma once

#include <cstdint>

#include <opbridge/kernel.h>

namespace shapes {

const opbridge::OpDecl& window_stats_decl();
const opbridge::OpDecl& window_stats_backward_decl();

// The kernels' arguments: x [rows, length]; the outputs [rows, length / window].
struct WindowStatsParams {
  int64_t rows = 0, length = 0, window = 1;
};
// From a call that passed the declaration's checks (forward or backward: both have x and window).
WindowStatsParams window_stats_params(const opbridge::KernelCall& k);

}  // namespace shapes
