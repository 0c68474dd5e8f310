// The contract of MultiScaleDeformableAttention, written once (see group_norm_decl.cpp for what
// derives from it). Its checks are ms_deform_attn_check (ms_deform_attn_cpu.cpp), which also
// reads the level sizes where they are known: they are host_memory inputs, CPU memory on GPU
// providers, validated before any kernel runs.
#include "opbridge/ms_deform_attn.h"
#include "opbridge/op_decl.h"

namespace opbridge {
namespace {

MsDeformAttnArg arg(const TensorArg& t) {
  if (!t.present || !t.rank_known) return {};
  return {t.shape.data(), t.rank(), t.type == ElemType::kUndefined ? nullptr : elem_type_name(t.type)};
}

Status validate(const OpCall& call) {
  const TensorArg& shapes = call.in("spatial_shapes");
  const TensorArg& starts = call.in("level_start_index");
  return ms_deform_attn_check(arg(call.in("value")), arg(shapes), arg(starts), arg(call.in("sampling_locations")),
                              arg(call.in("attention_weights")), shapes.int64_data(), starts.int64_data(), nullptr,
                              nullptr);
}

}  // namespace

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

}  // namespace opbridge
