// torch ops opbridge::_cpu_isa / _set_cpu_isa: the instruction-set level of this library's CPU
// kernels (opbridge/cpu_isa.h), for tests and benchmarks. Stable ABI, like every op of the library.
#include <string>

#include "opbridge/cpu_isa.h"
#include "torch_common.h"

namespace {

using opbridge::torch_adapter::BoxedArgs;

// _cpu_isa() -> str: the level in effect.
void cpu_isa(StableIValue* stack, uint64_t, uint64_t) {
  stack[0] = torch::stable::detail::from(
      std::string(opbridge::cpu_isa_name(opbridge::cpu_isa_resolve(opbridge::CpuIsa::kAuto))));
}

// _set_cpu_isa(str name) -> str: sets the level ('auto': the best) and returns the level in effect.
void set_cpu_isa(StableIValue* stack, uint64_t num_args, uint64_t) {
  const std::string name = BoxedArgs(stack, num_args).string(0);
  opbridge::CpuIsa isa;
  opbridge::torch_adapter::check_value(opbridge::parse_cpu_isa(name.c_str(), &isa), "opbridge::_set_cpu_isa",
                                       "name must be 'auto', 'baseline', 'avx2' or 'avx512', got '" + name + "'");
  stack[0] = torch::stable::detail::from(std::string(opbridge::cpu_isa_name(opbridge::set_cpu_isa(isa))));
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(opbridge, m) {
  m.def("_cpu_isa() -> str");
  m.def("_set_cpu_isa(str name) -> str");
}

// No tensor arguments: CompositeExplicitAutograd also serves calls with no dispatch key.
STABLE_TORCH_LIBRARY_IMPL(opbridge, CompositeExplicitAutograd, m) {
  m.impl("_cpu_isa", &cpu_isa);
  m.impl("_set_cpu_isa", &set_cpu_isa);
}
