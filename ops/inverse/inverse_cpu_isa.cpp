// Inverse's kernels for one instruction set: opbridge_add_op compiles this file once per set with
// its flags (OPBRIDGE_ISA_FN names the function, opbridge/cpu_isa.h). The AVX2 build serves every
// size; the AVX-512 build only the runtime-size kernel, which inverse_cpu runs for large matrices
// (kAvx512MinN): below that its 16-lane vectors leave the panel updates mostly remainders, and
// the unrolled fixed-size kernels are not compiled a third time.
#include "inverse_isa.h"
#include "opbridge/cpu_isa.h"

namespace opbridge::inverse_impl {

template <class T>
Failure OPBRIDGE_ISA_FN(run)(const T* a, T* out, int64_t begin, int64_t end, int64_t n) {
#if defined(OPBRIDGE_ISA_AVX512)
  return run_dynamic<T>(a, out, begin, end, static_cast<int>(n));
#else
  return run_range<T>(a, out, begin, end, n);
#endif
}

template Failure OPBRIDGE_ISA_FN(run)<float>(const float*, float*, int64_t, int64_t, int64_t);
template Failure OPBRIDGE_ISA_FN(run)<double>(const double*, double*, int64_t, int64_t, int64_t);

}  // namespace opbridge::inverse_impl
