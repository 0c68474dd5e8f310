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
#include <vector>

#include "opbridge/cpu_isa.h"
#include "opbridge/dtype.h"
#include "opbridge/op_decl.h"
#include "opbridge/parallel.h"
#include "opbridge/status.h"

namespace opbridge {

// The ONNX op type in domain ai.opbridge: the contract between exporter and ORT library.
inline constexpr const char* kGroupNormOpType = "GroupNorm";

// The op's declaration (opbridge/op_decl.h): arguments, types, versions, output rule, checks.
const OpDecl& group_norm_decl();

// The [N, C, S] view of x (channels_last = false) or [N, S, C] (channels_last = true: NHWC
// memory), S the product of the trailing dimensions (1 if none), G = num_groups. Every adapter
// computes it here: an empty x gives S = 0 (nothing to compute) and N * C is never formed then,
// so x = [2^62, 4, 0] cannot overflow.
struct GroupNormDims {
  int64_t N = 0, C = 0, S = 0, G = 1;
  bool channels_last = false;
};
// shape: x's shape (rank >= 2, already validated); num_groups: G.
GroupNormDims group_norm_dims(const std::vector<int64_t>& shape, int64_t num_groups, bool channels_last = false);

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
// type itself otherwise). Arguments must already have passed the declaration's checks (check_call). The variants
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
