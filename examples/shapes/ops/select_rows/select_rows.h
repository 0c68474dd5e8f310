// shapes::select_rows: the rows of x whose largest element exceeds threshold, in order: an output whose
// size the input values decide (rule "?, x[1]": the compute function sizes it).
//
// The op is its declaration (select_rows_decl.cpp), the function from a checked call to its kernels'
// arguments (select_rows_params, there too) and one compute function per device (select_rows_cpu.cpp).
// opbridge's generic adapters run the compute functions in torch, ONNX Runtime and opbridge._core:
// they check each call against the declaration and hand over contiguous tensors.
#pragma once

#include <cstdint>

#include <opbridge/kernel.h>

namespace shapes {

const opbridge::OpDecl& select_rows_decl();

// The kernels' arguments: x [rows, channels]; threshold.
struct SelectRowsParams {
  int64_t rows = 0, channels = 0;
  double threshold = 0.0;
};
// From a call that passed the declaration's checks.
SelectRowsParams select_rows_params(const opbridge::KernelCall& k);

}  // namespace shapes
