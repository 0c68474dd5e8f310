// userops LogCumSumExp: y[..., i, ...] = log(sum_{j <= i} exp(x[..., j, ...])) along one axis.
//
// The running log-sum-exp of torch.logcumsumexp, which ONNX has no operator for. Log(CumSum(Exp(x)))
// is no substitute: exp overflows for x > 88 in float32 and underflows to log(0) = -inf below
// about -103. The kernel keeps a running maximum m and the sum s of exp(x - m), rescaling s when
// the maximum grows, so every exp() it takes is of a value <= 0.
//
// The op is its declaration (log_cumsum_exp_decl.cpp), the function from a checked call to its
// kernels' arguments (log_cumsum_exp_dims, there too) and one compute function per device
// (log_cumsum_exp_cpu.cpp; with CUDA, log_cumsum_exp_kernel.cu), which opbridge's generic
// adapters run in torch, ONNX Runtime and opbridge._core.
#pragma once

#include <cstdint>

#include <opbridge/kernel.h>

namespace userops {

// The declaration: torch userops::log_cumsum_exp(Tensor x, int dim), ONNX
// com.example.userops::LogCumSumExp(X) with attribute axis.
const opbridge::OpDecl& log_cumsum_exp_decl();

// x viewed as [outer, len, inner] around the scanned axis.
struct ScanDims {
  int64_t outer = 1, len = 1, inner = 1;
};
// From a call that passed the declaration's checks.
ScanDims log_cumsum_exp_dims(const opbridge::KernelCall& k);

}  // namespace userops
