// MultiScaleDeformableAttention kernels compiled with the avx512 flags (see
// cmake/opbridge_ops.cmake); called only when opbridge::cpu_isa() allows avx512. float64 runs the
// same code on double lanes (F64Lanes), which the compiler vectorizes with these flags.
#include <type_traits>

#include "common/simd_avx512.h"
#include "ms_deform_attn_isa.h"
#include "ms_deform_attn_simd.h"

namespace opbridge::msda_isa {

template <class T>
void forward_avx512(const FwdArgs<T>& a, const ParallelFor& pf) {
  msda_forward<std::conditional_t<std::is_same_v<T, double>, F64Lanes, SimdAvx512>, T>(a, pf);
}

template <class T>
void backward_avx512(const BwdArgs<T>& a, const ParallelFor& pf) {
  msda_backward<std::conditional_t<std::is_same_v<T, double>, F64Lanes, SimdAvx512>, T>(a, pf);
}

#define OPBRIDGE_MSDA_INSTANTIATE(T)                                         \
  template void forward_avx512<T>(const FwdArgs<T>&, const ParallelFor&); \
  template void backward_avx512<T>(const BwdArgs<T>&, const ParallelFor&);
OPBRIDGE_MSDA_INSTANTIATE(float)
OPBRIDGE_MSDA_INSTANTIATE(double)
OPBRIDGE_MSDA_INSTANTIATE(Half)
OPBRIDGE_MSDA_INSTANTIATE(BFloat16)
#undef OPBRIDGE_MSDA_INSTANTIATE

}  // namespace opbridge::msda_isa
