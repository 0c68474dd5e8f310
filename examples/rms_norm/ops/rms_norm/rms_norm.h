// myops::rms_norm: y = x / sqrt(mean(x^2) + eps) * weight over the last dimension of x (one weight
// per channel), as torch.nn.functional.rms_norm and ONNX RMSNormalization-23 with axis = -1.
//
// The op is its declaration and backward's (rms_norm_decl.cpp), the function from a checked call to
// its kernels' arguments (rms_norm_params, there too) and one compute function per device
// (rms_norm_cpu.cpp; new-op --cuda adds rms_norm_kernel.cu). opbridge's generic adapters run the compute
// functions in torch, ONNX Runtime and opbridge._core: they check each call against the
// declaration, allocate the outputs from its rules and hand over contiguous tensors.
#pragma once

#include <cstdint>

#include <opbridge/kernel.h>

namespace myops {

const opbridge::OpDecl& rms_norm_decl();
const opbridge::OpDecl& rms_norm_backward_decl();

// The kernels' arguments: x viewed as [rows, channels], channels = x.shape[-1] and rows the
// product of the other dimensions (0 for an empty x); eps.
struct RmsNormParams {
  int64_t rows = 0, channels = 0;
  double eps = 1e-5;
};
// From a call that passed the declaration's checks (forward or backward: both have x and eps).
RmsNormParams rms_norm_params(const opbridge::KernelCall& k);

}  // namespace myops
