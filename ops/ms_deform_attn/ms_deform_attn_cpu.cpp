// MultiScaleDeformableAttention CPU kernels: framework-free, and the op's CPU compute functions
// (opbridge/kernel.h), which the torch op, the ORT op and opbridge._core share. (The checks every
// adapter runs are the declarations', ms_deform_attn_decl.cpp.)
//
// The kernels themselves are in ms_deform_attn_simd.h, compiled once per instruction set: here
// for the baseline, and from ms_deform_attn_cpu_isa.cpp once per instruction set with its flags.
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "common/simd_generic.h"
#include "ms_deform_attn_isa.h"
#include "ms_deform_attn_simd.h"
#include "opbridge/cpu_isa.h"
#include "ms_deform_attn.h"

namespace opbridge {

namespace msda_isa {
template <class T>
void run_baseline(const FwdArgs<T>& a, const ParallelFor& pf) {
  using S = std::conditional_t<std::is_same_v<T, double>, F64Lanes, SimdGeneric>;
  msda_forward<S, T>(a, pf);
}
template <class T>
void run_baseline(const BwdArgs<T>& a, const ParallelFor& pf) {
  using S = std::conditional_t<std::is_same_v<T, double>, F64Lanes, SimdGeneric>;
  msda_backward<S, T>(a, pf);
}
}  // namespace msda_isa

template <class T>
Status ms_deform_attn_cpu(const T* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                          const T* sampling_locations, const T* attention_weights, T* output,
                          const MsDeformAttnDims& d, const ParallelFor& pf, CpuIsa isa) {
  OPBRIDGE_RETURN_IF_ERROR(cpu_isa_check(isa));
  OPBRIDGE_RETURN_IF_ERROR(ms_deform_attn_check_levels(spatial_shapes, level_start_index, d.L, d.S));
  const msda_isa::FwdArgs<T> a{{value, spatial_shapes, level_start_index, sampling_locations, attention_weights},
                               output, d};
  cpu_isa_run(isa, a, pf);
  return Status::Ok();
}

template <class T>
Status ms_deform_attn_backward_cpu(const T* grad_output, const T* value, const int64_t* spatial_shapes,
                                   const int64_t* level_start_index, const T* sampling_locations,
                                   const T* attention_weights, T* grad_value, T* grad_sampling_locations,
                                   T* grad_attention_weights, const MsDeformAttnDims& d, const ParallelFor& pf,
                                   CpuIsa isa) {
  OPBRIDGE_RETURN_IF_ERROR(cpu_isa_check(isa));
  OPBRIDGE_RETURN_IF_ERROR(ms_deform_attn_check_levels(spatial_shapes, level_start_index, d.L, d.S));
  const msda_isa::BwdArgs<T> a{{value, spatial_shapes, level_start_index, sampling_locations, attention_weights},
                               grad_output, grad_value, grad_sampling_locations, grad_attention_weights, d};
  cpu_isa_run(isa, a, pf);
  return Status::Ok();
}

#define OPBRIDGE_MSDA_INSTANTIATE(T)                                                                             \
  template Status ms_deform_attn_cpu<T>(const T*, const int64_t*, const int64_t*, const T*, const T*, T*,       \
                                        const MsDeformAttnDims&, const ParallelFor&, CpuIsa);                    \
  template Status ms_deform_attn_backward_cpu<T>(const T*, const T*, const int64_t*, const int64_t*, const T*,  \
                                                 const T*, T*, T*, T*, const MsDeformAttnDims&,                  \
                                                 const ParallelFor&, CpuIsa);
OPBRIDGE_FOR_EACH_FLOAT_TYPE(OPBRIDGE_MSDA_INSTANTIATE)
#undef OPBRIDGE_MSDA_INSTANTIATE

// ---- the compute functions (opbridge/kernel.h) ------------------------------------------------

namespace {

Status forward(const KernelCall& k) {
  const MsDeformAttnDims d = ms_deform_attn_params(k);
  return dispatch<float, double, Half, BFloat16>(k.type("value"), [&](auto tag) {
    using T = decltype(tag);
    return ms_deform_attn_cpu<T>(k.in<T>("value"), k.in<int64_t>("spatial_shapes"), k.in<int64_t>("level_start_index"),
                                 k.in<T>("sampling_locations"), k.in<T>("attention_weights"), k.out<T>(0), d,
                                 k.parallel(), k.isa());
  });
}

Status backward(const KernelCall& k) {
  const MsDeformAttnDims d = ms_deform_attn_params(k);
  return dispatch<float, double, Half, BFloat16>(k.type("value"), [&](auto tag) {
    using T = decltype(tag);
    return ms_deform_attn_backward_cpu<T>(k.in<T>("grad_output"), k.in<T>("value"), k.in<int64_t>("spatial_shapes"),
                                          k.in<int64_t>("level_start_index"), k.in<T>("sampling_locations"),
                                          k.in<T>("attention_weights"), k.out<T>(0), k.out<T>(1), k.out<T>(2), d,
                                          k.parallel(), k.isa());
  });
}

}  // namespace

OPBRIDGE_KERNEL(ms_deform_attn_decl, kCpu, forward);
OPBRIDGE_KERNEL(ms_deform_attn_backward_decl, kCpu, backward);

}  // namespace opbridge
