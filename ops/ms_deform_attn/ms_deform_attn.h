// opbridge MultiScaleDeformableAttention (snake_case ms_deform_attn): multi-scale deformable
// attention sampling, the core of Deformable DETR and its descendants.
//
// Semantics of Deformable-DETR's ms_deform_attn_core_pytorch / MSDeformAttnFunction, mmcv's
// multi_scale_deformable_attn_pytorch and transformers' MultiScaleDeformableAttention:
//
//   output[n, q, m*D + d] = sum_l sum_p  a[n, q, m, l, p] * bilinear_l(value[n, :, m, d], x, y)
//
// with (x, y) = sampling_locations[n, q, m, l, p, :] in [0, 1] (x along the width), sampled at
// pixel coordinates (x * W_l - 0.5, y * H_l - 0.5) of level l (grid_sample with
// align_corners=False, i.e. of the grid 2 * loc - 1), zero padding: taps that fall outside the
// level's H_l x W_l map contribute 0. Level l occupies rows level_start_index[l] ..
// level_start_index[l] + H_l * W_l - 1 of value's S axis, row-major (y * W_l + x).
//
// Shapes (the view every adapter uses; all tensors contiguous):
//   value               (N, S, M, D)           S = sum_l H_l * W_l
//   spatial_shapes      (L, 2)      int64      rows (H_l, W_l)
//   level_start_index   (L,)        int64      level_start_index[l] = sum_{k<l} H_k * W_k
//   sampling_locations  (N, Lq, M, L, P, 2)    (x, y)
//   attention_weights   (N, Lq, M, L, P)
//   output              (N, Lq, M * D)
// value, sampling_locations, attention_weights and output share one element type T (float,
// double, Half, BFloat16); the 16-bit types are computed in float (coordinates, tap weights and
// sums), float and double in themselves.
//
// Edge cases (the contract of every kernel, CPU and CUDA; tests/ops/test_ms_deform_attn*.py):
// - A sample whose pixel coordinates are not inside (-1, W_l) x (-1, H_l) -- every tap outside
//   the map -- or are NaN or infinite contributes exactly 0 to the output, whatever its attention
//   weight (even NaN or inf), and gets zero gradients (location and attention weight). This is
//   what Deformable-DETR's CUDA kernel does; its pure-PyTorch form (grid_sample) agrees except
//   that it multiplies the 0 by the weight (NaN * 0 = NaN there).
// - A sample inside contributes a * sum over its in-map taps of (bilinear weight * value): NaN or
//   inf in its attention weight or in a tap's value propagates (0 * inf = NaN included).
// - At an exactly integral pixel coordinate the location gradient is the one-sided derivative
//   from the right (as for grid_sample), since floor() picks the taps.
// - Empty tensors (any of N, Lq, M, D, P = 0) are valid: nothing to sample (P = 0: output 0).
//
// Threading: the kernels run on the caller's ParallelFor (torch's or ORT's pool) and start no
// threads. Forward work is split over (n, m, query block) with each head's queries kept
// together (its slice of value stays in cache); backward over (n, m, level): grad_value rows of
// one head and one level receive contributions only from that unit, so there are no atomics, no
// per-thread copies, and results are bit-identical for every thread count.
#pragma once

#include <cstdint>
#include <string>

#include "opbridge/cpu_isa.h"
#include "opbridge/dtype.h"
#include "opbridge/kernel.h"
#include "opbridge/op_decl.h"
#include "opbridge/parallel.h"
#include "opbridge/status.h"

namespace opbridge {

// The ONNX op type in domain ai.opbridge: the contract between exporter and ORT library.
inline constexpr const char* kMsDeformAttnOpType = "MultiScaleDeformableAttention";

// The op's declaration (opbridge/op_decl.h): arguments, types, versions, output rule, checks.
const OpDecl& ms_deform_attn_decl();

// Levels are passed by value to CUDA kernels (one (H, W, start) triple each): the most there
// may be. Deformable DETR uses 4, DINO / Mask2Former 3-5.
inline constexpr int64_t kMsDeformAttnMaxLevels = 16;

struct MsDeformAttnDims {
  int64_t N = 0, S = 0, M = 0, D = 0, Lq = 0, L = 0, P = 0;
};

// The checks of ms_deform_attn (and of its backward) are its declarations' (check_call on an
// OpCall of ms_deform_attn_decl() or ms_deform_attn_backward_decl()): element types, ranks and the
// shared dimensions, 1 <= L <= kMsDeformAttnMaxLevels, and where the level tables' contents are in
// the call (TensorArg::data, host int64), ms_deform_attn_check_levels -- so that no sample of an
// accepted call can read outside value. Every adapter (torch and its fake kernel, ORT and its
// shape inference, opbridge._core) runs them, with the same messages: InvalidArgument for shapes
// and values, TypeError for element types.
const OpDecl& ms_deform_attn_backward_decl();

// The level checks that need the tables' contents: every H and W > 0, level_start_index[l] the sum
// of H * W of the levels before l (not checked when level_start_index is nullptr), and the total
// equal to S, all without overflow.
//   spatial_shapes: [L, 2] host int64 (H, W) rows; level_start_index: [L] host int64 or nullptr
Status ms_deform_attn_check_levels(const int64_t* spatial_shapes, const int64_t* level_start_index, int64_t L,
                                   int64_t S);

// The sizes of a call of ms_deform_attn or ms_deform_attn_backward that passed check_call, and
// the same from a compute function's KernelCall: the kernels' arguments besides the tensors
// (defined with the declarations, ms_deform_attn_decl.cpp).
MsDeformAttnDims ms_deform_attn_dims(const OpCall& call);
MsDeformAttnDims ms_deform_attn_params(const KernelCall& k);

// Forward on the CPU.
//   value:              [N, S, M, D]
//   spatial_shapes:     [L, 2] host int64 (H_l, W_l)
//   level_start_index:  [L] host int64
//   sampling_locations: [N, Lq, M, L, P, 2]
//   attention_weights:  [N, Lq, M, L, P]
//   output:             [N, Lq, M * D], fully written; may not overlap the inputs
//   d:                  the sizes (ms_deform_attn_dims)
//   pf:                 the caller's parallel-for
//   isa:                the instruction-set variant (kAuto: the process-wide level, see
//                       cpu_isa.h); one this CPU or build lacks gives a NotImplemented status
// Arguments must already have passed the declaration's checks with both tables' contents; the
// kernel repeats only the cheap level checks (it never reads outside value). The variants differ in
// the last bits only (fused multiply-adds); float64 is computed the same way by all.
template <class T>
Status ms_deform_attn_cpu(const T* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                          const T* sampling_locations, const T* attention_weights, T* output,
                          const MsDeformAttnDims& d, const ParallelFor& pf, CpuIsa isa = CpuIsa::kAuto);

// Backward on the CPU: the gradients of sum(output * grad_output).
//   grad_output:  [N, Lq, M * D]
//   value ... attention_weights, d, pf, isa: as for ms_deform_attn_cpu
//   grad_value:              [N, S, M, D] or nullptr (not needed)
//   grad_sampling_locations: [N, Lq, M, L, P, 2] or nullptr
//   grad_attention_weights:  [N, Lq, M, L, P] or nullptr
// Every requested output is fully written (no zero-filling needed before the call); grad_value
// is accumulated in float for the 16-bit types. Deterministic: the same bits for every thread
// count and run.
template <class T>
Status ms_deform_attn_backward_cpu(const T* grad_output, const T* value, const int64_t* spatial_shapes,
                                   const int64_t* level_start_index, const T* sampling_locations,
                                   const T* attention_weights, T* grad_value, T* grad_sampling_locations,
                                   T* grad_attention_weights, const MsDeformAttnDims& d, const ParallelFor& pf,
                                   CpuIsa isa = CpuIsa::kAuto);

}  // namespace opbridge
