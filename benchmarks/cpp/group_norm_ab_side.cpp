// One side of group_norm_ab.cpp: the GroupNorm forward and backward of whichever group_norm_simd.h
// and group_norm_backward_simd.h the include path finds first, compiled with the AVX2 flags (or
// AVX-512's, as the library's AVX-512 variant is: group_norm_ab.sh with GN_AB_ISA=avx512) and
// exported as gn_ab_<GN_AB_SIDE> and gn_ab_bwd_<GN_AB_SIDE> (a or b). The headers' kernels have
// internal linkage, so two copies of this file built from two versions of the headers link into
// one program side by side. Built by group_norm_ab.sh.
#if defined(__AVX512F__)
#define OPBRIDGE_ISA_AVX512 1
#else
#define OPBRIDGE_ISA_AVX2 1
#endif
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
