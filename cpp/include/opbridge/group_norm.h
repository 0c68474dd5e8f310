// opbridge GroupNorm: y = (x - mean_g) / sqrt(var_g + eps) * weight[c] + bias[c]
//
// Semantics of torch.nn.functional.group_norm and ONNX GroupNormalization-21: the C channels
// are split into num_groups groups of C / num_groups consecutive channels; mean and (biased)
// variance are taken over each group's channels and all trailing ("spatial") elements of one
// sample; weight and bias are per channel.
//
// Layout used by every kernel: x and y are contiguous [N, C, S], where S is the product of the
// trailing dimensions (1 when there are none).
//
// Edge cases (tests/test_group_norm_edge_cases.py):
// - An empty x (any dimension 0) gives an empty y; nothing is computed or allocated, however
//   large the other dimensions are (x = [2^62, 1, 0] is valid). Adapters pass S = 0 then and
//   never compute numel / (N * C), whose N * C may overflow.
// - A group of one element, or a constant group, has zero variance: y = bias for eps > 0, and
//   NaN for eps = 0 (0 / 0, as torch.nn.functional.group_norm gives).
// - NaN or inf in x makes its whole group NaN; an infinite weight or bias gives the infinity
//   (x - mean) * rstd * weight + bias has (NaN where the normalized value is exactly 0).
//
// Accuracy (checked by the fuzzer, tests/fuzz/ops/group_norm.py), for finite results:
//   |y - ref| <= tol * (|w| * (1 + |xhat|) + |b|) + 64 * 2^-53 * |w| * |mean| * rstd
// with ref the float64 result on the same inputs, xhat the normalized value, and tol 1e-12
// (float64), 2e-5 (float32), 1e-3 (float16), 8e-3 (bfloat16). A large common offset costs
// nothing (mean 1e6 with unit variance in float32 stays within 1e-5): the statistics are
// two-pass with a shifted first pass, and the mean is split into its float rounding and a double
// remainder. Limits: float32 and bfloat16 statistics are accumulated in float, like torch's, so
// |x - mean| must stay below ~1e18 (float16 data is always safe); beyond that the result may be
// inf or NaN.
#pragma once

#include <cstdint>
#include <string>

#include "opbridge/cpu_isa.h"
#include "opbridge/dtype.h"
#include "opbridge/parallel.h"
#include "opbridge/status.h"

namespace opbridge {

// The ONNX op type in domain ai.opbridge: the contract between exporter and ORT library.
inline constexpr const char* kGroupNormOpType = "GroupNorm";

enum class Activation : int32_t { kNone = 0, kSilu = 1 };  // applied after the affine: y = act(xhat * w + b)
// The tensor view every adapter uses: x is [N, C, S] (channels_last = false) or [N, S, C] (channels_last = true,
// i.e. NHWC / NDHWC memory), S = product of the spatial dims (1 if none). G = num_groups.
struct GroupNormDims { int64_t N = 0, C = 0, S = 0, G = 1; bool channels_last = false; };

// Validates GroupNorm arguments; the same checks and messages serve torch and ORT.
//   rank:        rank of x (must be >= 2)
//   channels:    x.shape[1]
//   num_groups:  must be > 0 and divide `channels`
//   weight_len:  number of elements of weight, or -1 when absent
//   bias_len:    number of elements of bias, or -1 when absent
//   eps:         must be finite and >= 0
//   weight_name: how the caller's API names the per-channel scale ("weight" / "scale")
Status group_norm_check(int64_t rank, int64_t channels, int64_t num_groups, int64_t weight_len,
                        int64_t bias_len, double eps, const char* weight_name = "weight");

// Forward on the CPU.
//   x:      [N, C, S] input (N, C or S may be 0: nothing is computed then)
//   weight: [C] per-channel scale, or nullptr for 1
//   bias:   [C] per-channel shift, or nullptr for 0
//   y:      [N, C, S] output (may not alias x)
//   mean, rstd: optional [N, G] outputs (nullptr to skip) with each group's mean and
//               1/sqrt(var + eps), in the accumulation type of T (both 0 for empty groups)
//   pf:     the caller's parallel-for
//   isa:    the instruction-set variant to run (kAuto: the process-wide level, see cpu_isa.h);
//           asking for one this CPU or build lacks returns a NotImplemented status
// T is float, double, Half or BFloat16 (accumulation in float for the 16-bit types, in the
// type itself otherwise). Arguments must already have passed group_norm_check. The variants
// differ in the last bits only (vector width, fused multiply-adds); float64 has one variant.
template <class T>
Status group_norm_cpu(const T* x, const T* weight, const T* bias, T* y, int64_t N, int64_t C,
                      int64_t S, int64_t num_groups, double eps, acc_t<T>* mean, acc_t<T>* rstd,
                      const ParallelFor& pf, CpuIsa isa = CpuIsa::kAuto);

// Backward on the CPU: gradients of group_norm with respect to x, weight and bias.
//   dy, x:   [N, C, S]; weight: [C] or nullptr
//   dx:      [N, C, S] output, or nullptr to skip
//   dweight, dbias: [C] outputs, or nullptr to skip
// The group statistics are recomputed from x (one extra read of x, no saved state). An empty x
// gives zero dweight and dbias.
template <class T>
Status group_norm_backward_cpu(const T* dy, const T* x, const T* weight, T* dx, T* dweight,
                               T* dbias, int64_t N, int64_t C, int64_t S, int64_t num_groups,
                               double eps, const ParallelFor& pf);

}  // namespace opbridge
