// opbridge: instruction-set variants of CPU kernels, chosen at run time.
//
// Kernels that profit from wider vectors are compiled once for the architecture's baseline
// (x86-64: SSE2) and, on x86-64, once more for AVX2 + FMA; kAuto picks the best one the CPU
// supports. The explicit values exist so that tests can run every variant on one machine.
#pragma once

namespace opbridge {

enum class CpuIsa {
  kAuto,      // the best variant this CPU supports
  kBaseline,  // the architecture's baseline (runs everywhere)
  kAvx2,      // x86-64 with AVX2 and FMA
};

inline const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kBaseline: return "baseline";
    case CpuIsa::kAvx2: return "avx2";
  }
  return "unknown";
}

// Whether this build has, and this CPU (and OS) can run, the variant `isa`.
inline bool cpu_isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kBaseline:
      return true;
    case CpuIsa::kAvx2:
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
      // Also checks that the OS saves the AVX registers (XCR0).
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
  }
  return false;
}

// The variant kAuto stands for on this CPU.
inline CpuIsa cpu_isa_resolve(CpuIsa isa) {
  if (isa != CpuIsa::kAuto) return isa;
  return cpu_isa_supported(CpuIsa::kAvx2) ? CpuIsa::kAvx2 : CpuIsa::kBaseline;
}

}  // namespace opbridge
