// torch ops opbridge::_cpu_isa / _set_cpu_isa: the instruction-set level of this library's CPU
// kernels (opbridge/cpu_isa.h), for tests and benchmarks.
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <string>

#include "opbridge/cpu_isa.h"

// _cpu_isa() reports the level, _set_cpu_isa(name) sets it ('auto': the best) and returns the
// level in effect.
TORCH_LIBRARY_FRAGMENT(opbridge, m) {
  m.def("_cpu_isa() -> str",
        [] { return std::string(opbridge::cpu_isa_name(opbridge::cpu_isa_resolve(opbridge::CpuIsa::kAuto))); });
  m.def("_set_cpu_isa(str name) -> str", [](const std::string& name) {
    opbridge::CpuIsa isa;
    TORCH_CHECK_VALUE(opbridge::parse_cpu_isa(name.c_str(), &isa),
                      "opbridge::_set_cpu_isa: name must be 'auto', 'baseline', 'avx2' or 'avx512', got '", name, "'");
    return std::string(opbridge::cpu_isa_name(opbridge::set_cpu_isa(isa)));
  });
}
