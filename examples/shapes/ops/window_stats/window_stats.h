// shapes::window_stats: per window of `window` consecutive elements of each row of x, their sum and their
// sum of squares (two outputs of shape (N, L // window); a last partial window is left out).
//
// The op's kernels, framework-free: raw pointers, sizes, the caller's thread pool, a Status.
// The torch op (window_stats_torch.cpp) and the ORT op (window_stats_ort.cpp) are thin adapters around them;
// the contract both follow (arguments, types, checks, output shapes) is the declaration in
// window_stats_decl.cpp.
#pragma once

#include <cstdint>

#include <opbridge/op_decl.h>
#include <opbridge/parallel.h>
#include <opbridge/status.h>

namespace shapes {

// The op's declaration (opbridge/op_decl.h) and its backward's (torch autograd calls it).
const opbridge::OpDecl& window_stats_decl();
const opbridge::OpDecl& window_stats_backward_decl();

struct WindowStatsDims {
  int64_t rows = 0, length = 0, window = 1;  // x: [rows, length]; outputs: [rows, length / window]
};
WindowStatsDims window_stats_dims(const opbridge::OpCall& call);

// Forward: sum, sumsq fully written. Backward: grad_x = grad_sum + 2 x grad_sumsq in each window, 0
// in the left-out tail. T: float or double.
template <class T>
opbridge::Status window_stats_cpu(const T* x, T* sum, T* sumsq, const WindowStatsDims& d,
                                  const opbridge::ParallelFor& pf);
template <class T>
opbridge::Status window_stats_backward_cpu(const T* grad_sum, const T* grad_sumsq, const T* x, T* grad_x,
                                           const WindowStatsDims& d, const opbridge::ParallelFor& pf);

}  // namespace shapes
