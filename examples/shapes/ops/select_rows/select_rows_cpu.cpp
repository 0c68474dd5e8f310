// CPU kernels of shapes::select_rows (see select_rows.h): framework-free, shared by the torch and ORT ops.
#include <algorithm>
#include <vector>

#include "select_rows.h"

namespace shapes {

template <class T>
int64_t select_rows_count(const T* x, int64_t rows, int64_t channels, double threshold, uint8_t* keep) {
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    keep[r] = channels > 0 && *std::max_element(x + r * channels, x + (r + 1) * channels) > threshold;
    count += keep[r];
  }
  return count;
}

template <class T>
void select_rows_copy(const T* x, const uint8_t* keep, int64_t rows, int64_t channels, T* y) {
  for (int64_t r = 0; r < rows; ++r) {
    if (keep[r]) y = std::copy_n(x + r * channels, channels, y);
  }
}

template int64_t select_rows_count<float>(const float*, int64_t, int64_t, double, uint8_t*);
template int64_t select_rows_count<double>(const double*, int64_t, int64_t, double, uint8_t*);
template void select_rows_copy<float>(const float*, const uint8_t*, int64_t, int64_t, float*);
template void select_rows_copy<double>(const double*, const uint8_t*, int64_t, int64_t, double*);

}  // namespace shapes
