// FurthestPointSample's hot loop for one instruction set: opbridge_add_op compiles this file once
// per set with its flags (OPBRIDGE_ISA_FN names the function, opbridge/cpu_isa.h).
#include "furthest_point_sample_isa.h"
#include "opbridge/cpu_isa.h"

namespace opbridge::fps_isa {

template <class C>
std::pair<C, int64_t> OPBRIDGE_ISA_FN(update)(const C* x, const C* y, const C* z, C* d, int64_t begin, int64_t end,
                                              C px, C py, C pz) {
  return update<C>(x, y, z, d, begin, end, px, py, pz);
}

template std::pair<float, int64_t> OPBRIDGE_ISA_FN(update)<float>(const float*, const float*, const float*, float*,
                                                                  int64_t, int64_t, float, float, float);
template std::pair<double, int64_t> OPBRIDGE_ISA_FN(update)<double>(const double*, const double*, const double*,
                                                                    double*, int64_t, int64_t, double, double, double);

}  // namespace opbridge::fps_isa
