// opbridge MultiScaleDeformableAttention on CUDA: the framework-free launchers, called by the
// torch and ORT adapters with their own stream. Plain C++ (needs the CUDA runtime API header,
// not nvcc), so the adapters compile with the host compiler. Semantics: see
// ms_deform_attn.h.
//
// Shapes (all device tensors contiguous): value [N, S, M, D]; sampling_locations
// [N, Lq, M, L, P, 2] as (x, y) in [0, 1]; attention_weights [N, Lq, M, L, P]; output
// [N, Lq, M * D]. Each level l is sampled bilinearly at pixel (x * W_l - 0.5, y * H_l - 0.5)
// (grid_sample with align_corners=False and zero padding: taps outside the map contribute 0);
// a location that is NaN or infinite, or whose sample lies wholly outside the map, contributes
// exactly 0 (also when its attention weight is NaN), and its gradients are 0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ms_deform_attn.h"

namespace opbridge::cuda {

// Queues output = ms_deform_attn(...) on `stream`; returns the launch error (never
// synchronizes). spatial_shapes_host [L, 2] (H, W rows) and level_start_index_host [L] are host
// arrays, copied into the kernel arguments (L <= kMsDeformAttnMaxLevels), that must already have
// passed the op's validation; the launcher re-checks what memory safety depends on (every level
// inside [0, S), sizes that fit its index types) and returns cudaErrorInvalidValue otherwise.
// T: float, double, Half or BFloat16 (16-bit types are accumulated in float).
template <class T>
cudaError_t launch_ms_deform_attn(cudaStream_t stream, const T* value, const int64_t* spatial_shapes_host,
                                  const int64_t* level_start_index_host, const T* sampling_locations,
                                  const T* attention_weights, T* output, const MsDeformAttnDims& d);

// Bytes of device scratch launch_ms_deform_attn_backward<T> needs for these sizes: grad_value is
// accumulated by atomic adds, in float for the 16-bit types (N * S * M * D floats, converted at
// the end), directly into grad_value otherwise (0 bytes).
template <class T>
size_t ms_deform_attn_backward_workspace_bytes(const MsDeformAttnDims& d);

// Queues the gradients of ms_deform_attn with respect to value, sampling_locations and
// attention_weights on `stream`. Any grad_* may be nullptr (not computed). Outputs are fully
// written: grad_value is zero-filled here, on the stream, before the atomic adds.
//   workspace: device memory of at least ms_deform_attn_backward_workspace_bytes<T>(d) bytes,
//              16-byte aligned, alive until the queued work has run; nullptr: the launcher
//              allocates what it needs with cudaMallocAsync on `stream` (and frees it the same
//              way), outside the framework's caching allocator
template <class T>
cudaError_t launch_ms_deform_attn_backward(cudaStream_t stream, const T* grad_output, const T* value,
                                           const int64_t* spatial_shapes_host,
                                           const int64_t* level_start_index_host, const T* sampling_locations,
                                           const T* attention_weights, T* grad_value,
                                           T* grad_sampling_locations, T* grad_attention_weights,
                                           const MsDeformAttnDims& d, void* workspace = nullptr,
                                           size_t workspace_bytes = 0);

}  // namespace opbridge::cuda
