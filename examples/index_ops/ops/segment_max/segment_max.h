// index_ops::segment_max: y[s, c] = the largest values[i, c] with segment_ids[i] == s, argmax[s, c] that i.
//
// The op is its declaration and backward's (segment_max_decl.cpp), the function from a checked call to
// its kernels' arguments (segment_max_params, there too) and one compute function per device
// (segment_max_cpu.cpp; new-op --cuda adds segment_max_kernel.cu). opbridge's generic adapters run the compute
// functions in torch, ONNX Runtime and opbridge._core: they check each call against the
// declaration, allocate the outputs from its rules and hand over contiguous tensors.
#pragma once

#include <cstdint>

#include <opbridge/kernel.h>

namespace index_ops {

const opbridge::OpDecl& segment_max_decl();
const opbridge::OpDecl& segment_max_backward_decl();

// The kernels' arguments: values [rows, channels], y and argmax [segments, channels].
struct SegmentMaxParams {
  int64_t rows = 0, channels = 0, segments = 0;
};
// From a call that passed the declaration's checks (forward or backward: both have values and num_segments).
SegmentMaxParams segment_max_params(const opbridge::KernelCall& k);

}  // namespace index_ops
