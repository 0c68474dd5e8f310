// The contract of MultiScaleDeformableAttention and of its backward, written once (see
// group_norm_decl.cpp for what derives from it), with their checks: every adapter (torch and its
// fake kernel, ORT and its shape inference, opbridge._core) runs these, with the same messages.
// They also read the level sizes where they are known: spatial_shapes and level_start_index are
// host_memory inputs (CPU memory on GPU providers), validated before any kernel runs.
#include <initializer_list>
#include <string>

#include "ms_deform_attn.h"
#include "opbridge/op_decl.h"

namespace opbridge {
namespace {

// "[2, 100, ?, 32]": a shape for messages, unknown dimensions as "?".
std::string shape_str(const TensorArg& a) {
  std::string s = "[";
  for (int64_t i = 0; i < a.rank(); ++i) {
    if (i > 0) s += ", ";
    s += a.shape[static_cast<size_t>(i)] >= 0 ? std::to_string(a.shape[static_cast<size_t>(i)]) : "?";
  }
  return s + "]";
}

// Whether the rank is known (an absent tensor's is not: nothing is checked of it).
bool ranked(const TensorArg& a) { return a.present && a.rank_known; }
// Dimension i of a (-1 when the rank or the dimension is unknown).
int64_t dim(const TensorArg& a, int64_t i) { return ranked(a) && a.rank() > i ? a.dim(i) : -1; }
// Whether two dimensions may be equal (either unknown, or both known and equal).
bool agree(int64_t a, int64_t b) { return a < 0 || b < 0 || a == b; }
std::string known(int64_t v) { return v >= 0 ? std::to_string(v) : std::string("?"); }

// The first of the dimensions that is known, or -1.
int64_t first_known(std::initializer_list<int64_t> dims) {
  for (int64_t v : dims) {
    if (v >= 0) return v;
  }
  return -1;
}

// The checks of the forward (grad_output == nullptr) and of the backward, in one order: ranks,
// the shared dimensions, the backward's grad_output, the level tables' contents. (Element types
// are the declaration's: checked before this runs.)
Status check(const OpCall& call, const TensorArg* grad_output) {
  const TensorArg &value = call.in("value"), &spatial_shapes = call.in("spatial_shapes"),
                  &level_start_index = call.in("level_start_index"), &loc = call.in("sampling_locations"),
                  &aw = call.in("attention_weights");
  if (ranked(value) && value.rank() != 4) {
    return Status::InvalidArgument("value must have rank 4 (N, S, M, D), got shape " + shape_str(value));
  }
  if (ranked(spatial_shapes) && (spatial_shapes.rank() != 2 || !agree(dim(spatial_shapes, 1), 2))) {
    return Status::InvalidArgument("spatial_shapes must have shape (L, 2), one (H, W) row per level, got shape " +
                                   shape_str(spatial_shapes));
  }
  if (ranked(level_start_index) && level_start_index.rank() != 1) {
    return Status::InvalidArgument("level_start_index must have shape (L,), one start per level, got shape " +
                                   shape_str(level_start_index));
  }
  if (ranked(loc) && (loc.rank() != 6 || !agree(dim(loc, 5), 2))) {
    return Status::InvalidArgument("sampling_locations must have shape (N, Lq, M, L, P, 2), got shape " +
                                   shape_str(loc));
  }
  if (ranked(aw) && aw.rank() != 5) {
    return Status::InvalidArgument("attention_weights must have shape (N, Lq, M, L, P), got shape " + shape_str(aw));
  }
  if (grad_output != nullptr && ranked(*grad_output) && grad_output->rank() != 3) {
    return Status::InvalidArgument("grad_output must have shape (N, Lq, M * D), got shape " + shape_str(*grad_output));
  }

  const int64_t N = dim(value, 0), S = dim(value, 1), M = dim(value, 2), D = dim(value, 3);
  const int64_t L = dim(spatial_shapes, 0);
  if (L >= 0 && (L < 1 || L > kMsDeformAttnMaxLevels)) {
    return Status::InvalidArgument("spatial_shapes must have between 1 and " + std::to_string(kMsDeformAttnMaxLevels) +
                                   " rows (one per level), got " + std::to_string(L));
  }
  if (!agree(dim(level_start_index, 0), L)) {
    return Status::InvalidArgument("level_start_index must have L = " + std::to_string(L) +
                                   " elements (one per row of spatial_shapes), got shape " +
                                   shape_str(level_start_index));
  }
  if (!agree(dim(loc, 0), N) || !agree(dim(loc, 2), M) || !agree(dim(loc, 3), L)) {
    return Status::InvalidArgument("sampling_locations must have shape (N, Lq, M, L, P, 2) with N = value.shape[0] = " +
                                   known(N) + ", M = value.shape[2] = " + known(M) +
                                   " and L = spatial_shapes.shape[0] = " + known(L) + ", got shape " + shape_str(loc));
  }
  // The (N, Lq, M, L, P) every per-sample tensor shares, from whichever argument knows each.
  const int64_t nq[5] = {first_known({dim(loc, 0), N}), dim(loc, 1), first_known({dim(loc, 2), M}),
                         first_known({dim(loc, 3), L}), dim(loc, 4)};
  for (int i = 0; i < 5; ++i) {
    if (!agree(dim(aw, i), nq[i])) {
      std::string want = "[";
      for (int k = 0; k < 5; ++k) want += (k ? ", " : "") + known(nq[k]);
      return Status::InvalidArgument("attention_weights must have shape (N, Lq, M, L, P) = sampling_locations.shape[:5] = " +
                                     want + "], got shape " + shape_str(aw));
    }
  }
  if (grad_output != nullptr) {
    const int64_t n = first_known({nq[0], dim(aw, 0)}), lq = first_known({nq[1], dim(aw, 1)});
    int64_t md = -1;
    const int64_t m = first_known({nq[2], dim(aw, 2)});
    if (m >= 0 && D >= 0 && __builtin_mul_overflow(m, D, &md)) md = -1;
    if (!agree(dim(*grad_output, 0), n) || !agree(dim(*grad_output, 1), lq) || !agree(dim(*grad_output, 2), md)) {
      return Status::InvalidArgument("grad_output must have the output's shape (N, Lq, M * D) = [" + known(n) + ", " +
                                     known(lq) + ", " + known(md) + "], got shape " + shape_str(*grad_output));
    }
  }
  const int64_t* shapes_data = spatial_shapes.int64_data();
  if (shapes_data != nullptr && L >= 0 && S >= 0) {
    OPBRIDGE_RETURN_IF_ERROR(ms_deform_attn_check_levels(shapes_data, level_start_index.int64_data(), L, S));
  }
  return Status::Ok();
}

Status validate(const OpCall& call) { return check(call, nullptr); }
Status validate_backward(const OpCall& call) { return check(call, &call.in("grad_output")); }

}  // namespace

Status ms_deform_attn_check_levels(const int64_t* spatial_shapes, const int64_t* level_start_index, int64_t L,
                                   int64_t S) {
  if (L < 1 || L > kMsDeformAttnMaxLevels) {
    return Status::InvalidArgument("spatial_shapes must have between 1 and " + std::to_string(kMsDeformAttnMaxLevels) +
                                   " rows (one per level), got " + std::to_string(L));
  }
  int64_t total = 0;
  bool overflow = false;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t h = spatial_shapes[2 * l], w = spatial_shapes[2 * l + 1];
    if (h <= 0 || w <= 0) {
      return Status::InvalidArgument("spatial_shapes[" + std::to_string(l) + "] = (" + std::to_string(h) + ", " +
                                     std::to_string(w) + "): H and W must be > 0");
    }
    if (level_start_index != nullptr && !overflow && level_start_index[l] != total) {
      return Status::InvalidArgument("level_start_index[" + std::to_string(l) + "] must be " + std::to_string(total) +
                                     " (the sum of H * W of the levels before it), got " +
                                     std::to_string(level_start_index[l]));
    }
    int64_t hw = 0;
    if (__builtin_mul_overflow(h, w, &hw) || __builtin_add_overflow(total, hw, &total)) overflow = true;
  }
  if (overflow || total != S) {
    return Status::InvalidArgument("the levels' sizes must add up to S = value.shape[1] = " + std::to_string(S) +
                                   ", got sum of H * W over spatial_shapes = " +
                                   (overflow ? std::string("more than 2^63") : std::to_string(total)));
  }
  return Status::Ok();
}

MsDeformAttnDims ms_deform_attn_dims(const OpCall& call) {
  const TensorArg &value = call.in("value"), &loc = call.in("sampling_locations");
  MsDeformAttnDims d;
  d.N = value.dim(0);
  d.S = value.dim(1);
  d.M = value.dim(2);
  d.D = value.dim(3);
  d.Lq = loc.dim(1);
  d.L = loc.dim(3);
  d.P = loc.dim(4);
  return d;
}

MsDeformAttnDims ms_deform_attn_params(const KernelCall& k) { return ms_deform_attn_dims(k.call()); }

const OpDecl& ms_deform_attn_decl() {
  static const OpDecl decl =
      OpDecl("ms_deform_attn", kMsDeformAttnOpType, 2)
          .doc("Multi-scale deformable attention (Deformable DETR): for each query and head, the sum over levels "
               "and points of attention weight times the bilinearly sampled value (grid_sample, "
               "align_corners=False, zero padding).")
          .input("value", "T", "the flattened feature maps").shape("(N, S, M, D)")
          .input("spatial_shapes", "I", "(H_l, W_l) per level").shape("(L, 2)").host_memory()
          .input("level_start_index", "I", "offset of each level in S").shape("(L,)").host_memory()
          .input("sampling_locations", "T", "(x, y) in [0, 1]").shape("(N, Lq, M, L, P, 2)")
          .input("attention_weights", "T", "one weight per sample").shape("(N, Lq, M, L, P)")
          .types("T", kFloatTypes)
          .types("I", {ElemType::kInt64})
          .output("output", "T", "sampling_locations[0], sampling_locations[1], value[2]*value[3]", "(N, Lq, M * D)")
          .check(validate);
  return decl;
}

const OpDecl& ms_deform_attn_backward_decl() {
  static const OpDecl decl =
      OpDecl("ms_deform_attn_backward", "MultiScaleDeformableAttentionBackward", 2)
          .doc("Gradients of MultiScaleDeformableAttention with respect to value, sampling_locations and "
               "attention_weights, given the gradient of its output.")
          .input("grad_output", "T", "gradient of the output").shape("(N, Lq, M * D)")
          .args_of(ms_deform_attn_decl())
          .output("grad_value", "T", "value", "shape of value")
          .output("grad_sampling_locations", "T", "sampling_locations", "shape of sampling_locations")
          .output("grad_attention_weights", "T", "attention_weights", "shape of attention_weights")
          .gradient_of(ms_deform_attn_decl(), {"value", "sampling_locations", "attention_weights"})
          .check(validate_backward);
  return decl;
}

}  // namespace opbridge
