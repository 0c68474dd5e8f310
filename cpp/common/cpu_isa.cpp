// opbridge: run-time choice of the instruction-set variant of CPU kernels (see cpu_isa.h).
#include "opbridge/cpu_isa.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

namespace opbridge {

namespace {

// The best variant of this build this CPU can run.
CpuIsa detect_best() {
#if defined(OPBRIDGE_X86_DISPATCH) && (defined(__GNUC__) || defined(__clang__))
  // __builtin_cpu_supports also checks that the OS saves the wide registers (XCR0), so a
  // level reported here is usable, not just present in CPUID.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512) return CpuIsa::kAvx512;
  if (avx2) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kBaseline;
}

CpuIsa best() {
  static const CpuIsa b = detect_best();
  return b;
}

// kBaseline < kAvx2 < kAvx512; kAuto means "no cap".
CpuIsa cap(CpuIsa want) {
  if (want == CpuIsa::kAuto) return best();
  return static_cast<int>(want) < static_cast<int>(best()) ? want : best();
}

std::atomic<int>& level() {
  // Initialized once, thread-safely, on first use: the best level capped by the environment.
  static std::atomic<int> l{[] {
    CpuIsa isa = CpuIsa::kAuto;
    const char* env = std::getenv("OPBRIDGE_CPU_ISA");
    if (env != nullptr) parse_cpu_isa(env, &isa);
    return static_cast<int>(cap(isa));
  }()};
  return l;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kBaseline: return "baseline";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

bool parse_cpu_isa(const char* name, CpuIsa* isa) {
  for (CpuIsa c : {CpuIsa::kAuto, CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (std::strcmp(name, cpu_isa_name(c)) == 0) {
      *isa = c;
      return true;
    }
  }
  return false;
}

bool cpu_isa_supported(CpuIsa isa) {
  return isa == CpuIsa::kAuto || static_cast<int>(isa) <= static_cast<int>(best());
}

CpuIsa cpu_isa_resolve(CpuIsa isa) {
  if (isa != CpuIsa::kAuto) return isa;
  return static_cast<CpuIsa>(level().load(std::memory_order_relaxed));
}

CpuIsa set_cpu_isa(CpuIsa isa) {
  const CpuIsa now = cap(isa);
  level().store(static_cast<int>(now), std::memory_order_relaxed);
  return now;
}

Status cpu_isa_check(CpuIsa isa) {
  if (cpu_isa_supported(isa)) return Status::Ok();
  return Status::NotImplemented(std::string("the ") + cpu_isa_name(isa) +
                                " kernels are not available on this CPU or in this build");
}

}  // namespace opbridge
