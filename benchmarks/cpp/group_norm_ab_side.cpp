// One side of group_norm_ab.cpp: the GroupNorm forward and backward of whichever group_norm_simd.h
// and group_norm_backward_simd.h the include path finds first, compiled with the AVX2 flags and
// exported as gn_ab_<GN_AB_SIDE> and gn_ab_bwd_<GN_AB_SIDE> (a or b). The headers' kernels have
// internal linkage, so two copies of this file built from two versions of the headers link into
// one program side by side. Built by group_norm_ab.sh.
#define OPBRIDGE_ISA_AVX2 1
#include "common/simd_isa.h"
#include "group_norm_isa.h"
#include "group_norm_simd.h"
#include "group_norm_backward_simd.h"

#define GN_AB_CAT2(a, b) a##b
#define GN_AB_CAT(a, b) GN_AB_CAT2(a, b)

namespace opbridge {
void GN_AB_CAT(gn_ab_, GN_AB_SIDE)(const group_norm_isa::Args<float>& a, const ParallelFor& pf) {
  gn_forward<SimdIsa, float>(a, pf);
}
void GN_AB_CAT(gn_ab_bwd_, GN_AB_SIDE)(const group_norm_isa::BackwardArgs<float>& a, const ParallelFor& pf) {
  gn_backward<SimdIsa, float>(a, pf);
}
}  // namespace opbridge
