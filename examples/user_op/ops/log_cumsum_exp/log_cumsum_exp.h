// userops LogCumSumExp: y[..., i, ...] = log(sum_{j <= i} exp(x[..., j, ...])) along one axis.
//
// The running log-sum-exp of torch.logcumsumexp, which ONNX has no operator for. Log(CumSum(Exp(x)))
// is no substitute: exp overflows for x > 88 in float32 and underflows to log(0) = -inf below
// about -103. The kernel keeps a running maximum m and the sum s of exp(x - m), rescaling s when
// the maximum grows, so every exp() it takes is of a value <= 0.
//
// Framework-free, like opbridge's own kernels: raw pointers, the caller's ParallelFor, a Status.
// The op's contract (arguments, types, checks) is its declaration, log_cumsum_exp_decl.cpp.
#pragma once

#include <cstdint>

#include <opbridge/op_decl.h>
#include <opbridge/parallel.h>
#include <opbridge/status.h>

namespace userops {

// The declaration: torch userops::log_cumsum_exp(Tensor x, int dim), ONNX
// com.example.userops::LogCumSumExp(X) with attribute axis.
const opbridge::OpDecl& log_cumsum_exp_decl();

// x viewed as [outer, len, inner] around the scanned axis.
struct ScanDims {
  int64_t outer = 1, len = 1, inner = 1;
};
// The view of a call that passed the declaration's checks (torch and ORT both have one).
ScanDims log_cumsum_exp_dims(const opbridge::OpCall& call);

// CPU kernel. x and y: contiguous [outer, len, inner]; y may not alias x. T is float or double.
template <class T>
opbridge::Status log_cumsum_exp_cpu(const T* x, T* y, const ScanDims& dims, const opbridge::ParallelFor& pf);

}  // namespace userops
