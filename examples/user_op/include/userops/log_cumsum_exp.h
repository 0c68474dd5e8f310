// userops LogCumSumExp: y[..., i, ...] = log(sum_{j <= i} exp(x[..., j, ...])) along one axis.
//
// The running log-sum-exp of torch.logcumsumexp, which ONNX has no operator for. Log(CumSum(Exp(x)))
// is no substitute: exp overflows for x > 88 in float32 and underflows to log(0) = -inf below
// about -103. The kernel keeps a running maximum m and the sum s of exp(x - m), rescaling s when
// the maximum grows, so every exp() it takes is of a value <= 0.
//
// Framework-free, like opbridge's own kernels: raw pointers, the caller's ParallelFor, a Status.
#pragma once

#include <cstdint>
#include <vector>

#include "opbridge/parallel.h"
#include "opbridge/status.h"

namespace userops {

// The ONNX op type in this library's domain: the contract with the Python export declaration.
inline constexpr const char* kLogCumSumExpOpType = "LogCumSumExp";

// x viewed as [outer, len, inner] around the scanned axis.
struct ScanDims {
  int64_t outer = 1, len = 1, inner = 1;
};

// Validates the axis (-rank <= axis < rank; rank >= 1) and computes the [outer, len, inner] view.
//   shape:     the dimensions of x
//   axis:      the axis to scan; negative counts from the end
//   dims:      output
//   axis_name: how the caller's API names the axis in messages ("axis" in ONNX, "dim" in torch)
opbridge::Status log_cumsum_exp_check(const std::vector<int64_t>& shape, int64_t axis, ScanDims* dims,
                                      const char* axis_name = "axis");

// CPU kernel. x and y: contiguous [outer, len, inner]; y may not alias x. T is float or double.
template <class T>
opbridge::Status log_cumsum_exp_cpu(const T* x, T* y, const ScanDims& dims, const opbridge::ParallelFor& pf);

}  // namespace userops
