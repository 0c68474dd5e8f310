// opbridge: the SIMD vectors of the instruction set an <op>_cpu_isa.cpp is being compiled for
// (kernel-internal header). opbridge_add_op compiles that one source once per instruction set, in
// a generated <op>_cpu_<isa>.cpp that defines OPBRIDGE_ISA_<ISA> and comes with that set's flags;
// here it becomes `SimdIsa` (SimdAvx2, SimdAvx512), and OPBRIDGE_ISA_FN(name) (opbridge/cpu_isa.h)
// names the functions (name_avx2, name_avx512).
#pragma once

#include "opbridge/cpu_isa.h"

#if defined(OPBRIDGE_ISA_AVX512)
#include "common/simd_avx512.h"
namespace opbridge {
namespace {
using SimdIsa = SimdAvx512;
}  // namespace
}  // namespace opbridge
#elif defined(OPBRIDGE_ISA_AVX2)
#include "common/simd_avx2.h"
namespace opbridge {
namespace {
using SimdIsa = SimdAvx2;
}  // namespace
}  // namespace opbridge
#else
#error "simd_isa.h is for <op>_cpu_isa.cpp, compiled by opbridge_add_op once per instruction set"
#endif
