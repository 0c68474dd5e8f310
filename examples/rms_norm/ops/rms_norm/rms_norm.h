// myops::rms_norm: y = x / sqrt(mean(x^2) + eps) * weight over the last dimension of x (one weight
// per channel), as torch.nn.functional.rms_norm and ONNX RMSNormalization-23 with axis = -1.
//
// The op's kernels, framework-free: raw pointers, sizes, the caller's thread pool, a Status.
// The torch op (rms_norm_torch.cpp) and the ORT op (rms_norm_ort.cpp) are thin adapters around them;
// the contract both follow (arguments, types, checks, output shapes) is the declaration in
// rms_norm_decl.cpp.
#pragma once

#include <cstdint>

#include <opbridge/op_decl.h>
#include <opbridge/parallel.h>
#include <opbridge/status.h>

namespace myops {

// The op's declaration (opbridge/op_decl.h) and its backward's (torch autograd calls it).
const opbridge::OpDecl& rms_norm_decl();
const opbridge::OpDecl& rms_norm_backward_decl();

// The view every adapter uses: x is [rows, channels], channels = x.shape[-1], rows = the product
// of the other dimensions (0 for an empty x).
struct RmsNormDims {
  int64_t rows = 0, channels = 0;
};
// From a call that passed the declaration's checks (torch or ORT: both have one).
RmsNormDims rms_norm_dims(const opbridge::OpCall& call);

// Forward. x, y: [rows, channels], contiguous; weight: [channels]. T: float or double.
template <class T>
opbridge::Status rms_norm_cpu(const T* x, const T* weight, T* y, const RmsNormDims& d, double eps,
                          const opbridge::ParallelFor& pf);

// Backward: grad_x = d(loss)/dx and grad_weight = d(loss)/dweight from grad = d(loss)/dy.
// grad, x, grad_x: [rows, channels]; weight, grad_weight: [channels]; all fully written.
template <class T>
opbridge::Status rms_norm_backward_cpu(const T* grad, const T* x, const T* weight, T* grad_x, T* grad_weight,
                                   const RmsNormDims& d, double eps, const opbridge::ParallelFor& pf);

}  // namespace myops
