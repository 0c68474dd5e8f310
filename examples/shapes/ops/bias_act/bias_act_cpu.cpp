// CPU kernels of shapes::bias_act and their compute functions (see bias_act.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "bias_act.h"

namespace shapes {
namespace {

using opbridge::KernelCall;
using opbridge::Status;

// activation(x + bias) at element i of x [rows, channels], in double; its derivative in *slope.
template <class T>
double activate(const T* x, const T* bias, int64_t i, const BiasActParams& p, double* slope) {
  const double z = static_cast<double>(x[i]) + (bias ? static_cast<double>(bias[i % p.channels]) : 0.0);
  const double v = p.act == 1 ? std::max(z, 0.0) : p.act == 2 ? std::tanh(z) : z;
  *slope = p.act == 1 ? (z > 0 ? 1.0 : 0.0) : p.act == 2 ? 1.0 - v * v : 1.0;
  return v;
}

// y = activation(x + bias); bias: [channels] or nullptr.
template <class T>
void forward(const T* x, const T* bias, T* y, const BiasActParams& p) {
  double slope;
  for (int64_t i = 0; i < p.rows * p.channels; ++i) y[i] = static_cast<T>(activate(x, bias, i, p, &slope));
}

// grad_x = grad * activation'(x + bias); grad_bias[c] = the sum of grad_x over the rows.
template <class T>
void backward(const T* grad, const T* x, const T* bias, T* grad_x, T* grad_bias, const BiasActParams& p) {
  std::vector<double> sums(static_cast<size_t>(p.channels));
  double slope;
  for (int64_t i = 0; i < p.rows * p.channels; ++i) {
    activate(x, bias, i, p, &slope);
    const double g = slope * grad[i];
    grad_x[i] = static_cast<T>(g);
    sums[i % p.channels] += g;
  }
  for (int64_t c = 0; c < p.channels; ++c) grad_bias[c] = static_cast<T>(sums[c]);
}

// The compute functions: the checked call's tensors (contiguous, outputs allocated from the
// declaration's rules) into the kernels; k.in of the absent optional bias is nullptr.
Status forward_cpu(const KernelCall& k) {
  const BiasActParams p = bias_act_params(k);
  return opbridge::dispatch<float, double>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    forward<T>(k.in<T>("x"), k.in<T>("bias"), k.out<T>(0), p);
    return Status::Ok();
  });
}

Status backward_cpu(const KernelCall& k) {
  const BiasActParams p = bias_act_params(k);
  return opbridge::dispatch<float, double>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    backward<T>(k.in<T>("grad"), k.in<T>("x"), k.in<T>("bias"), k.out<T>(0), k.out<T>(1), p);
    return Status::Ok();
  });
}

}  // namespace

OPBRIDGE_KERNEL(bias_act_decl, kCpu, forward_cpu);
OPBRIDGE_KERNEL(bias_act_backward_decl, kCpu, backward_cpu);

}  // namespace shapes
