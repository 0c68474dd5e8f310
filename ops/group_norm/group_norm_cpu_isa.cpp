// GroupNorm forward and backward kernels, compiled once per instruction set by opbridge_add_op
// (a generated group_norm_cpu_<isa>.cpp includes this with that set's flags); called only when
// opbridge::cpu_isa() allows that set.
#include "common/simd_isa.h"
#include "group_norm_isa.h"
#include "group_norm_simd.h"
#include "group_norm_backward_simd.h"

namespace opbridge::group_norm_isa {

template <class T>
void OPBRIDGE_ISA_FN(forward)(const Args<T>& a, const ParallelFor& pf) {
  gn_forward<SimdIsa, T>(a, pf);
}

template void OPBRIDGE_ISA_FN(forward)<float>(const Args<float>&, const ParallelFor&);
template void OPBRIDGE_ISA_FN(forward)<Half>(const Args<Half>&, const ParallelFor&);
template void OPBRIDGE_ISA_FN(forward)<BFloat16>(const Args<BFloat16>&, const ParallelFor&);

template <class T>
void OPBRIDGE_ISA_FN(backward)(const BackwardArgs<T>& a, const ParallelFor& pf) {
  gn_backward<SimdIsa, T>(a, pf);
}

template void OPBRIDGE_ISA_FN(backward)<float>(const BackwardArgs<float>&, const ParallelFor&);
template void OPBRIDGE_ISA_FN(backward)<Half>(const BackwardArgs<Half>&, const ParallelFor&);
template void OPBRIDGE_ISA_FN(backward)<BFloat16>(const BackwardArgs<BFloat16>&, const ParallelFor&);

}  // namespace opbridge::group_norm_isa
