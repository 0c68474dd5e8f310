// GroupNorm forward and backward kernels compiled with the avx512 flags (see
// cmake/opbridge_ops.cmake); called only when opbridge::cpu_isa() allows avx512.
#include "common/simd_avx512.h"
#include "group_norm_isa.h"
#include "group_norm_simd.h"
#include "group_norm_backward_simd.h"

namespace opbridge::group_norm_isa {

template <class T>
void forward_avx512(const Args<T>& a, const ParallelFor& pf) {
  gn_forward<SimdAvx512, T>(a, pf);
}

template void forward_avx512<float>(const Args<float>&, const ParallelFor&);
template void forward_avx512<Half>(const Args<Half>&, const ParallelFor&);
template void forward_avx512<BFloat16>(const Args<BFloat16>&, const ParallelFor&);

template <class T>
void backward_avx512(const BackwardArgs<T>& a, const ParallelFor& pf) {
  gn_backward<SimdAvx512, T>(a, pf);
}

template void backward_avx512<float>(const BackwardArgs<float>&, const ParallelFor&);
template void backward_avx512<Half>(const BackwardArgs<Half>&, const ParallelFor&);
template void backward_avx512<BFloat16>(const BackwardArgs<BFloat16>&, const ParallelFor&);

}  // namespace opbridge::group_norm_isa
