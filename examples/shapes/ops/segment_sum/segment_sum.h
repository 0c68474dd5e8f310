// shapes::segment_sum: y[s] = the sum of the rows values[i] with segment_ids[i] == s, s < num_segments.
//
// The op is its declaration and backward's (segment_sum_decl.cpp), the function from a checked call to
// its kernels' arguments (segment_sum_params, there too) and one compute function per device
// (segment_sum_cpu.cpp). opbridge's generic adapters run the compute functions in torch, ONNX Runtime
// and opbridge._core: they check each call against the declaration, allocate the outputs from its
// rules and hand over contiguous tensors.
#pragma once

#include <cstdint>

#include <opbridge/kernel.h>

namespace shapes {

const opbridge::OpDecl& segment_sum_decl();
const opbridge::OpDecl& segment_sum_backward_decl();

// The kernels' arguments: values [rows, channels] (rows = segment_ids' length), y [segments, channels].
struct SegmentSumParams {
  int64_t rows = 0, channels = 0, segments = 0;
};
// From a call that passed the declaration's checks (forward or backward: both have values and num_segments).
SegmentSumParams segment_sum_params(const opbridge::KernelCall& k);

}  // namespace shapes
