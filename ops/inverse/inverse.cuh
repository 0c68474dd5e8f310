// opbridge Inverse on CUDA: the framework-free launcher, called by the torch and ORT adapters
// with their own stream. Plain C++ (needs the CUDA runtime API header, not nvcc), so the
// adapters compile with the host compiler. Semantics and layout: see inverse.h (Gauss-
// Jordan with partial pivoting; "singular" means an exactly zero pivot U[k,k]; NaN inputs give
// NaN outputs, not an error).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "opbridge/status.h"

namespace opbridge::cuda {

// The singular-matrix report written by launch_inverse: the first singular matrix of the batch
// (smallest index) and the elimination step k at which its pivot U[k,k] was zero, packed as
// (index << kInverseInfoStepBits) | k, or kInverseInfoOk (all bits set; -1 as an int64) when
// every matrix was invertible. Packed into one word so that it is a single atomicMin.
inline constexpr uint64_t kInverseInfoOk = ~uint64_t{0};
inline constexpr int kInverseInfoStepBits = 24;  // n < 2^24; batch < 2^39 keeps the word < 2^63

// Decodes an info word: true when a matrix was singular, with its batch index and step.
inline bool inverse_info_singular(uint64_t info, int64_t* index, int64_t* step) {
  if (info == kInverseInfoOk) return false;
  *index = static_cast<int64_t>(info >> kInverseInfoStepBits);
  *step = static_cast<int64_t>(info & ((uint64_t{1} << kInverseInfoStepBits) - 1));
  return true;
}

// The error for a singular matrix: the CPU kernel's message (inverse_cpu), so that both devices
// report the same thing.
inline Status inverse_singular_status(int64_t index, int64_t step) {
  return Status::LinAlgError("matrix " + std::to_string(index) + " of the batch is singular (U[" +
                              std::to_string(step) + "," + std::to_string(step) + "] == 0)");
}

// Bytes of device scratch launch_inverse<T> needs for these sizes (0: none). Depends only on
// the sizes, never on the device, so callers can allocate before launching.
template <class T>
size_t inverse_workspace_bytes(int64_t batch, int64_t n);

// Queues out[b] = a[b]^-1 for every matrix of the batch on `stream`; returns the launch error
// (never synchronizes).
//   stream:    the caller's stream (torch's current stream, ORT's compute stream)
//   a:         [batch, n, n] device input, contiguous, row-major
//   out:       [batch, n, n] device output; may be `a` itself (in place), must not overlap it
//              otherwise
//   batch, n:  sizes (either may be 0); n < 2^24 and batch < 2^39
//   info:      device pointer to one 8-byte word: reset on the stream, then set to the
//              singular-matrix report (see kInverseInfoOk). Read it back (ordered on the
//              stream) to detect singular matrices.
//   workspace: device memory of at least inverse_workspace_bytes<T>(batch, n) bytes, 16-byte
//              aligned (nullptr when that is 0), alive until the queued work has run
//   nan_on_singular: the output of a singular matrix is all NaN (the other matrices are
//              unaffected, and the report is written all the same); false: it is unspecified.
//              With true a caller that does not need to raise can skip reading the report, so
//              the call never synchronizes (and can be captured in a CUDA graph).
// T is float or double. Paths: n == 2 (float: adjugate in double, as on the CPU), n <= 32
// (one group of n lanes per matrix, rows in registers, many matrices per block), n <= 64 (one
// block per matrix in shared memory), larger n (one block per matrix, in place in `out`).
template <class T>
cudaError_t launch_inverse(cudaStream_t stream, const T* a, T* out, int64_t batch, int64_t n, uint64_t* info,
                           void* workspace, size_t workspace_bytes, bool nan_on_singular);

}  // namespace opbridge::cuda
