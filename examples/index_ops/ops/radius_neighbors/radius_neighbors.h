// index_ops::radius_neighbors: per query, the first k points within radius (int64 indices, -1 where fewer).
//
// The op is its declaration and backward's (radius_neighbors_decl.cpp), the function from a checked call to
// its kernels' arguments (radius_neighbors_params, there too) and one compute function per device
// (radius_neighbors_cpu.cpp; new-op --cuda adds radius_neighbors_kernel.cu). opbridge's generic adapters run the compute
// functions in torch, ONNX Runtime and opbridge._core: they check each call against the
// declaration, allocate the outputs from its rules and hand over contiguous tensors.
#pragma once

#include <cstdint>

#include <opbridge/kernel.h>

namespace index_ops {

const opbridge::OpDecl& radius_neighbors_decl();

// The kernels' arguments: points [points, dims], queries [queries, dims], indices [queries, k].
struct RadiusNeighborsParams {
  int64_t points = 0, queries = 0, dims = 0, k = 0;
  double radius = 0;
};
// From a call that passed the declaration's checks.
RadiusNeighborsParams radius_neighbors_params(const opbridge::KernelCall& k);

}  // namespace index_ops
