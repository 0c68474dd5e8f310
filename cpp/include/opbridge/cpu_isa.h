// opbridge: instruction-set variants of CPU kernels, chosen at run time.
//
// Hot kernels are compiled for the architecture's baseline (x86-64: SSE2) and, on x86-64, again
// for AVX2 + FMA + F16C and for AVX-512, into separately named functions; the wheel is never
// built with -march=native. Kernels take a CpuIsa argument: kAuto (the default) runs the
// process-wide level, the explicit values let tests run every variant on one machine.
//
// The process-wide level is the best one the CPU supports, capped by the environment variable
// OPBRIDGE_CPU_ISA ("baseline", "avx2", "avx512"; read once, on first use) or by set_cpu_isa().
// Each loaded opbridge library (torch extension, ORT library, _core) keeps its own level.
#pragma once

#include "opbridge/status.h"

namespace opbridge {

enum class CpuIsa {
  kAuto,      // the process-wide level (see above)
  kBaseline,  // the architecture's baseline (runs everywhere)
  kAvx2,      // x86-64 with AVX2, FMA and F16C (x86-64-v3 class CPUs)
  kAvx512,    // the above and AVX-512 F/BW/VL/DQ (x86-64-v4 class CPUs)
};

// "auto", "baseline", "avx2" or "avx512".
const char* cpu_isa_name(CpuIsa isa);

// Parses a cpu_isa_name() string.
//   name: the variant's name (case-sensitive)
//   isa:  receives the variant; left unchanged when `name` is not one
// Returns whether `name` was recognized.
bool parse_cpu_isa(const char* name, CpuIsa* isa);

// Whether this build has, and this CPU (and OS) can run, the variant `isa` (kAuto: always).
//   isa: the variant asked about
bool cpu_isa_supported(CpuIsa isa);

// Ok where cpu_isa_supported(isa), else the NotImplemented status a kernel returns for it.
//   isa: the variant a caller asked for
Status cpu_isa_check(CpuIsa isa);

// The variant a kernel runs for `isa`: kAuto resolves to the process-wide level, any other
// value is returned as is.
//   isa: the variant a caller asked for
CpuIsa cpu_isa_resolve(CpuIsa isa);

// Sets the process-wide level, capped to the best supported one; kAuto restores the best.
//   isa: the level wanted
// Returns the level now in effect. Meant for tests and benchmarks: calls already running keep
// the level they started with.
CpuIsa set_cpu_isa(CpuIsa isa);

}  // namespace opbridge

// In an <op>_cpu_isa.cpp (one source of hot loops that opbridge_add_op compiles once per
// instruction set, defining OPBRIDGE_ISA_AVX2 or OPBRIDGE_ISA_AVX512 with that set's flags):
// OPBRIDGE_ISA_FN(forward) is forward_avx2 or forward_avx512, the name the kernel calls for that
// variant.
#if defined(OPBRIDGE_ISA_AVX512)
#define OPBRIDGE_ISA_FN(name) name##_avx512
#elif defined(OPBRIDGE_ISA_AVX2)
#define OPBRIDGE_ISA_FN(name) name##_avx2
#endif

namespace opbridge {

// Runs the variant of a kernel that cpu_isa_resolve(isa) picks: run_avx512(args, more...),
// run_avx2(...) or run_baseline(...), found by argument-dependent lookup next to the type of
// `args` (an <op>_cpu_isa.cpp defines OPBRIDGE_ISA_FN(run) for its argument struct; the baseline
// is in the op's own source). Builds without the x86 variants (opbridge_add_op leaves
// OPBRIDGE_X86_DISPATCH undefined) always run the baseline.
//   isa:  the variant a caller asked for (cpu_isa_check() has accepted it)
//   args: the kernel's argument struct; overloads on its type tell one kernel from another
template <class Args, class... More>
void cpu_isa_run(CpuIsa isa, const Args& args, More&&... more) {
  switch (cpu_isa_resolve(isa)) {
#if defined(OPBRIDGE_X86_DISPATCH)
    case CpuIsa::kAvx512: run_avx512(args, more...); break;
    case CpuIsa::kAvx2: run_avx2(args, more...); break;
#endif
    default: run_baseline(args, more...); break;
  }
}

}  // namespace opbridge
