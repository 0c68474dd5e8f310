// MultiScaleDeformableAttention forward and backward, once per instruction set (internal
// header). ms_deform_attn_cpu() / ms_deform_attn_backward_cpu() pick one at run time
// (cpu_isa_run, opbridge/cpu_isa.h); each is defined in its own TU compiled with that instruction set's flags
// (ms_deform_attn_cpu_isa.cpp, once per set; the baseline in ms_deform_attn_cpu.cpp).
#pragma once

#include <cstdint>

#include "opbridge/dtype.h"
#include "ms_deform_attn.h"
#include "opbridge/parallel.h"

namespace opbridge::msda_isa {

// What both directions read: the values and the samples' positions and weights (see
// ms_deform_attn.h), already checked.
template <class T>
struct SampledValue {
  const T* value;
  const int64_t* spatial_shapes;
  const int64_t* level_start_index;
  const T* sampling_locations;
  const T* attention_weights;
};

// The arguments of ms_deform_attn_cpu.
template <class T>
struct FwdArgs : SampledValue<T> {
  T* output;
  MsDeformAttnDims d;
};

// The arguments of ms_deform_attn_backward_cpu; any grad_* may be nullptr.
template <class T>
struct BwdArgs : SampledValue<T> {
  const T* grad_output;
  T* grad_value;
  T* grad_sampling_locations;
  T* grad_attention_weights;
  MsDeformAttnDims d;
};

template <class T> void run_baseline(const FwdArgs<T>& a, const ParallelFor& pf);
template <class T> void run_avx2(const FwdArgs<T>& a, const ParallelFor& pf);
template <class T> void run_avx512(const FwdArgs<T>& a, const ParallelFor& pf);
template <class T> void run_baseline(const BwdArgs<T>& a, const ParallelFor& pf);
template <class T> void run_avx2(const BwdArgs<T>& a, const ParallelFor& pf);
template <class T> void run_avx512(const BwdArgs<T>& a, const ParallelFor& pf);

}  // namespace opbridge::msda_isa
