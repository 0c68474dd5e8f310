// LogCumSumExp CUDA launcher (framework-free; see log_cumsum_exp.h for the math).
#pragma once

#include <cuda_runtime_api.h>

#include "log_cumsum_exp.h"

namespace userops {

// Launches the scan on `stream` (and nothing else). x, y: device memory, contiguous
// [outer, len, inner], y may not alias x. T is float or double. Returns the launch error.
template <class T>
cudaError_t launch_log_cumsum_exp(cudaStream_t stream, const T* x, T* y, const ScanDims& dims);

}  // namespace userops
