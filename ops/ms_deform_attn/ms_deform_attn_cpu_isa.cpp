// MultiScaleDeformableAttention kernels, compiled once per instruction set by opbridge_add_op (a
// generated ms_deform_attn_cpu_<isa>.cpp includes this with that set's flags); called only when
// opbridge::cpu_isa() allows that set. float64 runs the same code on double lanes (F64Lanes),
// which the compiler vectorizes with these flags.
#include <type_traits>

#include "common/simd_isa.h"
#include "ms_deform_attn_isa.h"
#include "ms_deform_attn_simd.h"

namespace opbridge::msda_isa {

template <class T>
using Lanes = std::conditional_t<std::is_same_v<T, double>, F64Lanes, SimdIsa>;

template <class T>
void OPBRIDGE_ISA_FN(run)(const FwdArgs<T>& a, const ParallelFor& pf) {
  msda_forward<Lanes<T>, T>(a, pf);
}

template <class T>
void OPBRIDGE_ISA_FN(run)(const BwdArgs<T>& a, const ParallelFor& pf) {
  msda_backward<Lanes<T>, T>(a, pf);
}

#define OPBRIDGE_MSDA_INSTANTIATE(T)                                                 \
  template void OPBRIDGE_ISA_FN(run)<T>(const FwdArgs<T>&, const ParallelFor&); \
  template void OPBRIDGE_ISA_FN(run)<T>(const BwdArgs<T>&, const ParallelFor&);
OPBRIDGE_FOR_EACH_FLOAT_TYPE(OPBRIDGE_MSDA_INSTANTIATE)
#undef OPBRIDGE_MSDA_INSTANTIATE

}  // namespace opbridge::msda_isa
