// shapes::bias_act: y = activation(x + bias), bias optional (one per channel, the last dimension), activation
// a string attribute: "none", "relu" or "tanh".
//
// The op's kernels, framework-free: raw pointers, sizes, the caller's thread pool, a Status.
// The torch op (bias_act_torch.cpp) and the ORT op (bias_act_ort.cpp) are thin adapters around them;
// the contract both follow (arguments, types, checks, output shapes) is the declaration in
// bias_act_decl.cpp.
#pragma once

#include <cstdint>
#include <string>

#include <opbridge/op_decl.h>
#include <opbridge/parallel.h>
#include <opbridge/status.h>

namespace shapes {

// The op's declaration (opbridge/op_decl.h) and its backward's (torch autograd calls it).
const opbridge::OpDecl& bias_act_decl();
const opbridge::OpDecl& bias_act_backward_decl();

// x, y, grad, grad_x: [rows, channels]; bias, grad_bias: [channels], bias nullptr when absent.
// act: 0 none, 1 relu, 2 tanh (bias_act_code). T: float or double.
int bias_act_code(const std::string& activation);
template <class T>
opbridge::Status bias_act_cpu(const T* x, const T* bias, T* y, int64_t rows, int64_t channels, int act);
template <class T>
opbridge::Status bias_act_backward_cpu(const T* grad, const T* x, const T* bias, T* grad_x, T* grad_bias,
                                       int64_t rows, int64_t channels, int act);

}  // namespace shapes
