// Checks of the CUDA host emulation itself (tests/cuda_ops/cuda_host/sim/): small kernels that are right,
// and kernels with the mistakes the emulation must report, for tests/cuda_ops/test_cuda_host.py.
//
//   simt_selftest CASE
//     reduce        a block reduction (shuffles + __syncthreads + shared memory) over 3 blocks of
//                   80 threads (a partial last warp); exits 0 when the sums are right
//     cluster       a 4-block cluster: each block reads the others' shared memory; exits 0 when right
//     divergent     threads of one block wait at two different __syncthreads: must abort
//     exited-lane   a shuffle after half the warp has returned: must abort
//     deadlock      half a warp at __syncthreads, the other half at a shuffle: must abort
//     shared-oob    a read one element past a shared array (AddressSanitizer must report it)
//     nan-abs       fabs of a NaN keeps its sign set (PTX: an unspecified NaN); exits 0 if so
#include <cooperative_groups.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/launch.cuh"

namespace {

using opbridge::cuda::LaunchShape;
using opbridge::cuda::Stream;
using opbridge::cuda::launch;
namespace cg = cooperative_groups;

constexpr unsigned kFull = 0xffffffffu;

__global__ void reduce_kernel(const int* in, int* out) {
  OPBRIDGE_SHARED_ARRAY(int, part, 32);
  const int t = static_cast<int>(threadIdx.x);
  int v = in[blockIdx.x * blockDim.x + t];
  const int n_lanes = min(32, static_cast<int>(blockDim.x) - (t & ~31));  // the last warp is partial
  const unsigned lanes = n_lanes == 32 ? kFull : ((1u << n_lanes) - 1u);
  for (int off = 16; off > 0; off >>= 1) {
    const int o = __shfl_down_sync(lanes, v, off);
    if ((t & 31) + off < n_lanes) v += o;
  }
  if ((t & 31) == 0) part[t >> 5] = v;
  __syncthreads();
  if (t == 0) {
    int s = 0;
    for (unsigned w = 0; w < (blockDim.x + 31) / 32; ++w) s += part[w];
    out[blockIdx.x] = s;
  }
}

__global__ void cluster_kernel(int* out) {
  OPBRIDGE_SHARED_ARRAY(int, mine, 2);
  const cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) mine[1] = static_cast<int>(cluster.block_rank()) * 10 + 1;
  cluster.sync();
  if (threadIdx.x == 0) {
    int s = 0;
    for (unsigned r = 0; r < cluster.num_blocks(); ++r) s += cluster.map_shared_rank(mine, r)[1];
    out[blockIdx.x] = s;
  }
  cluster.sync();
}

__global__ void divergent_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void exited_lane_kernel(int* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_sync(kFull, static_cast<int>(threadIdx.x), 0);
}

__global__ void deadlock_kernel(int* out) {
  if (threadIdx.x < 16) {
    out[threadIdx.x] = __shfl_sync(kFull, 1, 0);
  } else {
    __syncthreads();
  }
}

__global__ void shared_oob_kernel(int* out, int i) {
  OPBRIDGE_SHARED_ARRAY(int, a, 8);
  a[threadIdx.x % 8] = 1;
  __syncthreads();
  out[threadIdx.x] = a[i];
}

cudaStream_t stream() {
  static char s;
  return reinterpret_cast<cudaStream_t>(&s);
}

int check(bool ok, const char* what) {
  if (!ok) std::fprintf(stderr, "simt_selftest: %s\n", what);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string c = argv[1];
  const Stream s{stream()};
  std::vector<int> out(256, -1);
  if (c == "reduce") {
    std::vector<int> in(3 * 80);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i * 7 % 13);
    if (launch(reduce_kernel, LaunchShape{dim3(3), dim3(80), 0, 1}, s, in.data(), out.data()) != cudaSuccess) return 1;
    for (int b = 0; b < 3; ++b) {
      int want = 0;
      for (int t = 0; t < 80; ++t) want += in[static_cast<size_t>(b * 80 + t)];
      if (out[static_cast<size_t>(b)] != want) return check(false, "wrong block sum");
    }
    return 0;
  }
  if (c == "cluster") {
    if (launch(cluster_kernel, LaunchShape{dim3(8), dim3(64), 0, 4}, s, out.data()) != cudaSuccess) return 1;
    for (int b = 0; b < 8; ++b) {
      if (out[static_cast<size_t>(b)] != 0 * 10 + 1 + 1 * 10 + 1 + 2 * 10 + 1 + 3 * 10 + 1) {
        return check(false, "wrong cluster sum");
      }
    }
    return 0;
  }
  if (c == "divergent") return launch(divergent_kernel, LaunchShape{dim3(1), dim3(32), 0, 1}, s, out.data());
  if (c == "exited-lane") return launch(exited_lane_kernel, LaunchShape{dim3(1), dim3(32), 0, 1}, s, out.data());
  if (c == "deadlock") return launch(deadlock_kernel, LaunchShape{dim3(1), dim3(32), 0, 1}, s, out.data());
  if (c == "shared-oob") return launch(shared_oob_kernel, LaunchShape{dim3(1), dim3(32), 0, 1}, s, out.data(), 8);
  if (c == "nan-abs") {
    const double n = std::nan("");
    return check(std::signbit(fabs(n)) && std::isnan(fabs(n)) && std::signbit(fabsf(static_cast<float>(n))) &&
                     fabs(-2.5) == 2.5,
                 "fabs does not model PTX's NaN result");
  }
  return 2;
}
