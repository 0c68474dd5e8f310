// GroupNorm forward and backward kernels compiled with the avx2 flags (see
// cmake/opbridge_ops.cmake); called only when opbridge::cpu_isa() allows avx2.
#include "common/simd_avx2.h"
#include "group_norm_isa.h"
#include "group_norm_simd.h"
#include "group_norm_backward_simd.h"

namespace opbridge::group_norm_isa {

template <class T>
void forward_avx2(const Args<T>& a, const ParallelFor& pf) {
  gn_forward<SimdAvx2, T>(a, pf);
}

template void forward_avx2<float>(const Args<float>&, const ParallelFor&);
template void forward_avx2<Half>(const Args<Half>&, const ParallelFor&);
template void forward_avx2<BFloat16>(const Args<BFloat16>&, const ParallelFor&);

template <class T>
void backward_avx2(const BackwardArgs<T>& a, const ParallelFor& pf) {
  gn_backward<SimdAvx2, T>(a, pf);
}

template void backward_avx2<float>(const BackwardArgs<float>&, const ParallelFor&);
template void backward_avx2<Half>(const BackwardArgs<Half>&, const ParallelFor&);
template void backward_avx2<BFloat16>(const BackwardArgs<BFloat16>&, const ParallelFor&);

}  // namespace opbridge::group_norm_isa
