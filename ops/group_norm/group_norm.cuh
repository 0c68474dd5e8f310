// opbridge GroupNorm on CUDA: the framework-free launcher, called by the op's CUDA compute
// function (group_norm_kernel.cu) with the framework's stream (torch's current stream, ORT's
// compute stream). Plain C++ (needs the CUDA runtime API header, not nvcc). Semantics and
// layout: see group_norm.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "opbridge/dtype.h"
#include "group_norm.h"

namespace opbridge::cuda {

// Bytes of device scratch memory launch_group_norm<T> needs for these sizes (0: none). Depends
// only on the sizes and the layout, never on the device, so callers can allocate before
// launching.
template <class T>
size_t group_norm_workspace_bytes(const GroupNormDims& d);

// Queues y = act(group_norm(x)) on `stream`; returns the launch error (never synchronizes).
//   stream:     the caller's stream (torch's current stream, ORT's compute stream); all work,
//               including reads of the workspace, is ordered on it
//   x:          device input, dense: [N, C, S] (d.channels_last = false) or [N, S, C]
//               (d.channels_last = true: NHWC / NDHWC memory)
//   weight:     [C] device per-channel scale, or nullptr for 1
//   bias:       [C] device per-channel shift, or nullptr for 0
//   y:          device output in x's layout, not aliasing x
//   p:          sizes (N, C, S: any may be 0; G divides C) and layout, eps (added to the
//               variance), act (applied to the affine output, kSilu: y = v * sigmoid(v), fused
//               into the store)
//   workspace:  device memory of at least group_norm_workspace_bytes<T>(d) bytes, 16-byte
//               aligned (nullptr when that is 0); must stay allocated until the queued work has
//               run (stream-ordered frees of the caching allocators guarantee that)
// T: float, double, Half or BFloat16; statistics are accumulated in float for the 16-bit
// types (in the type itself otherwise). Arguments must already have passed the declaration's checks.
template <class T>
cudaError_t launch_group_norm(cudaStream_t stream, const T* x, const T* weight, const T* bias, T* y,
                              const GroupNormParams& p, void* workspace, size_t workspace_bytes);

}  // namespace opbridge::cuda
