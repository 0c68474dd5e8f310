// shapes::bias_act: y = activation(x + bias), bias optional (one per channel, the last dimension), activation
// a string attribute: "none", "relu" or "tanh".
//
// The op is its declaration and backward's (bias_act_decl.cpp), the function from a checked call to
// its kernels' arguments (bias_act_params, there too) and one compute function per device
// (bias_act_cpu.cpp). opbridge's generic adapters run the compute functions in torch, ONNX Runtime
// and opbridge._core: they check each call against the declaration, allocate the outputs from its
// rules and hand over contiguous tensors.
#pragma once

#include <cstdint>

#include <opbridge/kernel.h>

namespace shapes {

const opbridge::OpDecl& bias_act_decl();
const opbridge::OpDecl& bias_act_backward_decl();

// The kernels' arguments: x viewed as [rows, channels], channels = x.shape[-1] and rows the
// product of the other dimensions (0 for an empty x); act: 0 none, 1 relu, 2 tanh.
struct BiasActParams {
  int64_t rows = 0, channels = 0;
  int act = 0;
};
// From a call that passed the declaration's checks (forward or backward: both have x and activation).
BiasActParams bias_act_params(const opbridge::KernelCall& k);

}  // namespace shapes
