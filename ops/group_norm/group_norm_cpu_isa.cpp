// GroupNorm forward and backward kernels, compiled once per instruction set by opbridge_add_op
// (a generated group_norm_cpu_<isa>.cpp includes this with that set's flags); called only when
// opbridge::cpu_isa() allows that set.
#include "common/simd_isa.h"
#include "group_norm_isa.h"
#include "group_norm_simd.h"
#include "group_norm_backward_simd.h"

namespace opbridge::group_norm_isa {

template <class T>
void OPBRIDGE_ISA_FN(run)(const Args<T>& a, const ParallelFor& pf) {
  gn_forward<SimdIsa, T>(a, pf);
}

template <class T>
void OPBRIDGE_ISA_FN(run)(const BackwardArgs<T>& a, const ParallelFor& pf) {
  gn_backward<SimdIsa, T>(a, pf);
}

#define OPBRIDGE_GN_INSTANTIATE(T)                                          \
  template void OPBRIDGE_ISA_FN(run)<T>(const Args<T>&, const ParallelFor&); \
  template void OPBRIDGE_ISA_FN(run)<T>(const BackwardArgs<T>&, const ParallelFor&);
OPBRIDGE_GN_INSTANTIATE(float)
OPBRIDGE_GN_INSTANTIATE(Half)
OPBRIDGE_GN_INSTANTIATE(BFloat16)
#undef OPBRIDGE_GN_INSTANTIATE

}  // namespace opbridge::group_norm_isa
