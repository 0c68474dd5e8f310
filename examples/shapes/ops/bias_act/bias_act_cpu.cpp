// CPU kernels of shapes::bias_act (see bias_act.h): framework-free, shared by the torch and ORT ops.
#include <algorithm>
#include <cmath>
#include <vector>

#include "bias_act.h"

namespace shapes {
namespace {

template <class T>
void activate(const T* x, const T* bias, int64_t r, int64_t c, int64_t C, int act, double* v, double* slope) {
  const double z = static_cast<double>(x[r * C + c]) + (bias ? static_cast<double>(bias[c]) : 0.0);
  *v = act == 1 ? std::max(z, 0.0) : act == 2 ? std::tanh(z) : z;
  *slope = act == 1 ? (z > 0 ? 1.0 : 0.0) : act == 2 ? 1.0 - *v * *v : 1.0;
}

}  // namespace

int bias_act_code(const std::string& activation) { return activation == "relu" ? 1 : activation == "tanh" ? 2 : 0; }

template <class T>
opbridge::Status bias_act_cpu(const T* x, const T* bias, T* y, int64_t rows, int64_t channels, int act) {
  double v, slope;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < channels; ++c) activate(x, bias, r, c, channels, act, &v, &slope), y[r * channels + c] = T(v);
  }
  return opbridge::Status::Ok();
}

template <class T>
opbridge::Status bias_act_backward_cpu(const T* grad, const T* x, const T* bias, T* grad_x, T* grad_bias,
                                       int64_t rows, int64_t channels, int act) {
  std::vector<double> sums(static_cast<size_t>(channels));
  double v, slope;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < channels; ++c) {
      activate(x, bias, r, c, channels, act, &v, &slope);
      const double g = slope * grad[r * channels + c];
      grad_x[r * channels + c] = T(g), sums[c] += g;
    }
  }
  for (int64_t c = 0; c < channels; ++c) grad_bias[c] = T(sums[c]);
  return opbridge::Status::Ok();
}

template opbridge::Status bias_act_cpu<float>(const float*, const float*, float*, int64_t, int64_t, int);
template opbridge::Status bias_act_cpu<double>(const double*, const double*, double*, int64_t, int64_t, int);
template opbridge::Status bias_act_backward_cpu<float>(const float*, const float*, const float*, float*, float*,
                                                       int64_t, int64_t, int);
template opbridge::Status bias_act_backward_cpu<double>(const double*, const double*, const double*, double*, double*,
                                                        int64_t, int64_t, int);

}  // namespace shapes
