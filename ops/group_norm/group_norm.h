// opbridge GroupNorm: y = act((x - mean_g) / sqrt(var_g + eps) * weight[c] + bias[c])
//
// Semantics of torch.nn.functional.group_norm and ONNX GroupNormalization-21: the C channels
// are split into num_groups groups of C / num_groups consecutive channels; mean and (biased)
// variance are taken over each group's channels and all trailing ("spatial") elements of one
// sample; weight and bias are per channel. act is applied last (none, or SiLU: z * sigmoid(z)).
//
// Layouts (GroupNormDims): x and y are contiguous [N, C, S] (channels_last = false) or
// [N, S, C] (channels_last = true: NHWC / NDHWC memory), S the product of the spatial dims (1
// when there are none). group_norm_dims() derives that view from a shape.
//
// Edge cases (tests/ops/test_group_norm_edge_cases.py):
// - An empty x (any dimension 0) gives an empty y; nothing is computed or allocated, however
//   large the other dimensions are (x = [2^62, 1, 0] is valid). group_norm_dims() gives S = 0
//   then and never computes numel / (N * C), whose N * C may overflow.
// - A group of one element, or a constant group, has zero variance: y = act(bias) for eps > 0,
//   and NaN for eps = 0 (0 / 0, as torch.nn.functional.group_norm gives).
// - NaN or inf in x makes its whole group NaN; an infinite weight or bias gives the infinity
//   (x - mean) * rstd * weight + bias has (NaN where the normalized value is exactly 0). SiLU
//   follows torch: silu(+inf) = inf, silu(-inf) = NaN.
//
// Accuracy (checked by the fuzzer, tests/fuzz/ops/group_norm.py), for finite results:
//   |y - ref| <= tol * (|w| * (1 + |xhat|) + |b|) + 64 * 2^-53 * |w| * |mean| * rstd
// (before the activation, which changes errors by at most its slope, <= 1.1 for SiLU, plus
// its own rounding) with ref the float64 result on the same inputs, xhat the normalized value,
// and tol 1e-12 (float64), 2e-5 (float32), 1e-3 (float16), 8e-3 (bfloat16). A large common
// offset costs nothing (mean 1e6 with unit variance in float32 stays within 1e-5): the
// statistics are two-pass with a shifted first pass, and the mean is split into its float
// rounding and a double remainder. Limits: float32 and bfloat16 statistics are accumulated in
// float, like torch's, so |x - mean| must stay below ~1e18 (float16 data is always safe);
// beyond that the result may be inf or NaN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "opbridge/cpu_isa.h"
#include "opbridge/dtype.h"
#include "opbridge/kernel.h"
#include "opbridge/op_decl.h"
#include "opbridge/parallel.h"
#include "opbridge/status.h"

namespace opbridge {

// The ONNX op type in domain ai.opbridge: the contract between exporter and ORT library.
inline constexpr const char* kGroupNormOpType = "GroupNorm";

// The op's declaration (opbridge/op_decl.h): arguments, types, versions, output rule, checks;
// and its backward's: group_norm_backward(grad, <group_norm's arguments>) -> (grad_x,
// grad_weight, grad_bias), the gradients with respect to x, weight and bias (the latter two as
// if weight were 1 where it is absent: the caller drops what it does not need).
const OpDecl& group_norm_decl();
const OpDecl& group_norm_backward_decl();

// The activation applied after the affine: y = act(xhat * w + b).
enum class Activation : int32_t { kNone = 0, kSilu = 1 };

// "none" / "silu": the spelling of the torch argument and the ONNX attribute `activation` (the
// declaration checks the value).
inline const char* activation_name(Activation a) { return a == Activation::kSilu ? "silu" : "none"; }
inline Activation activation_from_name(const std::string& name) {
  return name == "silu" ? Activation::kSilu : Activation::kNone;
}

// The tensor view every adapter uses: x is [N, C, S] (channels_last = false) or [N, S, C]
// (channels_last = true, i.e. NHWC / NDHWC memory), S = product of the spatial dims (1 if none).
// G = num_groups.
struct GroupNormDims {
  int64_t N = 0, C = 0, S = 0, G = 1;
  bool channels_last = false;
};

// The GroupNormDims of x, from its logical shape (N, C, *spatial) (torch's sizes; for a
// channels-last tensor still in that order) and how its memory is laid out.
//   shape, rank:   x's logical shape, rank >= 2 (the declaration's checks reject less)
//   num_groups:    G
//   channels_last: whether x's memory is [N, *spatial, C]
// S = 0 for an empty x (any dimension 0), so that callers never divide by N * C, which may
// overflow then (x = [2^62, 2^62, 0]); otherwise S is the product of the spatial dims, which
// fits as x's element count does.
inline GroupNormDims group_norm_dims(const int64_t* shape, size_t rank, int64_t num_groups, bool channels_last) {
  GroupNormDims d;
  d.N = rank > 0 ? shape[0] : 0;
  d.C = rank > 1 ? shape[1] : 0;
  d.G = num_groups;
  d.channels_last = channels_last;
  bool empty = d.N == 0 || d.C == 0;
  int64_t s = 1;
  for (size_t i = 2; i < rank; ++i) {
    if (shape[i] == 0) empty = true;
  }
  if (!empty) {
    for (size_t i = 2; i < rank; ++i) s *= shape[i];
  }
  d.S = empty ? 0 : s;
  return d;
}
inline GroupNormDims group_norm_dims(const std::vector<int64_t>& shape, int64_t num_groups,
                                     bool channels_last = false) {
  return group_norm_dims(shape.data(), shape.size(), num_groups, channels_last);
}

// The kernels' arguments besides the tensors.
struct GroupNormParams {
  GroupNormDims d;                     // sizes and layout
  double eps = 1e-5;                   // added to the variance
  Activation act = Activation::kNone;  // applied after the affine
};

// The GroupNormParams of a call of group_norm or group_norm_backward that passed the
// declaration's checks, in the call's layout (KernelCall::channels_last()): what every compute
// function hands its kernel (defined with the declaration, group_norm_decl.cpp).
GroupNormParams group_norm_params(const KernelCall& k);

// The cache-dependent choices of the CPU kernels (float32 and 16-bit), made once per process
// from the caches the OS reports for CPU 0 (Linux sysfs; the C library's report of the L2 where
// sysfs has none). For experiments, OPBRIDGE_GROUP_NORM_CACHE_BUDGET,
// OPBRIDGE_GROUP_NORM_STREAM_BYTES and OPBRIDGE_GROUP_NORM_WAVE_BYTES (bytes, optional K / M / G
// suffix; read on first use; other values are ignored) replace the derived values (the first
// sets both budgets), and OPBRIDGE_GROUP_NORM_FUSE=0 turns off the fused [N, C, S] schedule;
// OPBRIDGE_GROUP_NORM_L2_BYTES and OPBRIDGE_GROUP_NORM_L3_BYTES replace the cache sizes the OS
// reports (0: none), and the values derived from them follow, as on a machine with those caches.
struct GroupNormCpuChoices {
  int64_t l2_bytes = 0;      // per-core L2 (0: not reported)
  int64_t l3_bytes = 0;      // L3 that CPU 0 shares (0: not reported)
  int64_t cache_budget = 0;  // bytes of a group / sample kept in cache between the two passes
  int64_t cache_budget_streamed = 0;  // the same where the output is written with streaming stores
  int64_t stream_bytes = 0;  // outputs of at least this many bytes are written with streaming stores
  int64_t wave_bytes = 0;    // channels-last input a wave of tiles may hold, at least (half the L3)
  bool fuse_groups = true;   // [N, C, S]: sum each group while normalizing the one before it
  bool overridden = false;   // whether the environment replaced a derived value or a cache size
};
const GroupNormCpuChoices& group_norm_cpu_choices();

// Forward on the CPU.
//   x:      [N, C, S] or [N, S, C] input (see GroupNormDims; N, C or S may be 0: nothing is
//           computed then)
//   weight: [C] per-channel scale, or nullptr for 1
//   bias:   [C] per-channel shift, or nullptr for 0
//   y:      output in x's layout (may not alias x)
//   p:      sizes and layout (from group_norm_dims()), eps, activation
//   mean, rstd: optional [N, G] outputs (nullptr to skip) with each group's mean and
//               1/sqrt(var + eps), in the accumulation type of T (both 0 for empty groups)
//   pf:     the caller's parallel-for
//   isa:    the instruction-set variant to run (kAuto: the process-wide level, see cpu_isa.h);
//           asking for one this CPU or build lacks returns a NotImplemented status
// T is float, double, Half or BFloat16 (accumulation in float for the 16-bit types, in the
// type itself otherwise). Arguments must already have passed the declaration's checks (check_call). The variants
// differ in the last bits only (vector width, fused multiply-adds); float64 has one variant.
template <class T>
Status group_norm_cpu(const T* x, const T* weight, const T* bias, T* y, const GroupNormParams& p, acc_t<T>* mean,
                      acc_t<T>* rstd, const ParallelFor& pf, CpuIsa isa = CpuIsa::kAuto);
// The same with the parameters one by one (sizes, eps, activation).
template <class T>
Status group_norm_cpu(const T* x, const T* weight, const T* bias, T* y, const GroupNormDims& d, double eps,
                      Activation act, acc_t<T>* mean, acc_t<T>* rstd, const ParallelFor& pf,
                      CpuIsa isa = CpuIsa::kAuto) {
  GroupNormParams p;
  p.d = d;
  p.eps = eps;
  p.act = act;
  return group_norm_cpu<T>(x, weight, bias, y, p, mean, rstd, pf, isa);
}

// Backward on the CPU: gradients of group_norm (with `act`) with respect to x, weight and bias.
//   dy, x:   in the layout of `d`; weight, bias: [C] or nullptr (bias is needed by SiLU's
//            derivative, which depends on the pre-activation)
//   dx:      output in x's layout, or nullptr to skip; it may be dy's memory or x's (computed in
//            place), and must overlap neither otherwise
//   dweight, dbias: [C] outputs, or nullptr to skip (computed as if weight = 1 when it is absent)
//   isa:     the instruction-set variant to run, as for group_norm_cpu
// The group statistics are recomputed from x (one extra read of x, no saved state). An empty x
// gives zero dweight and dbias.
template <class T>
Status group_norm_backward_cpu(const T* dy, const T* x, const T* weight, const T* bias, T* dx, T* dweight, T* dbias,
                               const GroupNormParams& p, const ParallelFor& pf, CpuIsa isa = CpuIsa::kAuto);
template <class T>
Status group_norm_backward_cpu(const T* dy, const T* x, const T* weight, const T* bias, T* dx, T* dweight, T* dbias,
                               const GroupNormDims& d, double eps, Activation act, const ParallelFor& pf,
                               CpuIsa isa = CpuIsa::kAuto) {
  GroupNormParams p;
  p.d = d;
  p.eps = eps;
  p.act = act;
  return group_norm_backward_cpu<T>(dy, x, weight, bias, dx, dweight, dbias, p, pf, isa);
}

}  // namespace opbridge
