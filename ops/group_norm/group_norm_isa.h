// GroupNorm forward and backward for float, Half and BFloat16, once per instruction set
// (internal header). group_norm_cpu() picks one at run time (cpu_isa_run, opbridge/cpu_isa.h);
// each is defined in its own TU compiled with that instruction set's flags (group_norm_cpu_isa.cpp,
// once per set; the baseline in group_norm_cpu.cpp).
#pragma once

#include <cstdint>

#include "opbridge/dtype.h"
#include "group_norm.h"
#include "opbridge/parallel.h"

namespace opbridge::group_norm_isa {

// The arguments of group_norm_cpu (see group_norm.h), already checked.
template <class T>
struct Args {
  const T* x;
  const T* weight;  // nullptr: 1
  const T* bias;    // nullptr: 0
  T* y;
  GroupNormDims d;
  double eps;
  Activation act;
  float* mean;  // [N, G] or nullptr
  float* rstd;  // [N, G] or nullptr
  // Bytes of input one thread may keep in its own cache between reading it for the statistics
  // and reading it again to normalize (half the per-core L2, see group_norm_cpu_choices()).
  int64_t cache_budget;
  // The same where y is written with streaming stores (y then takes no room in the cache).
  int64_t cache_budget_streamed;
  // Outputs of at least this many bytes are written with streaming stores.
  int64_t stream_bytes;
  // Channels-last input a wave of tiles may hold, at least (a share of the L3; 0: none known).
  int64_t wave_bytes;
  // [N, C, S]: sum each group's statistics while normalizing the group before it, where the
  // shapes allow (gn_forward_nchw).
  bool fuse_groups;
};

template <class T> void run_baseline(const Args<T>& a, const ParallelFor& pf);
template <class T> void run_avx2(const Args<T>& a, const ParallelFor& pf);
template <class T> void run_avx512(const Args<T>& a, const ParallelFor& pf);

// The arguments of the backward kernels (group_norm_backward_cpu), already checked. The kernels
// write dx (unless null) and, for the caller's dweight / dbias, the per-channel sums and rstd.
template <class T>
struct BackwardArgs {
  const T* dy;
  const T* x;
  const T* weight;  // nullptr: 1
  const T* bias;    // nullptr: 0
  T* dx;            // nullptr: not wanted
  GroupNormDims d;
  double eps;
  Activation act;
  double* ds;    // [N, C]: sum over the channel of dz * (x - mean), dz = dy * act'(z)
  double* db;    // [N, C]: sum over the channel of dz
  double* rstd;  // [N, G]
  // Bytes of input (x and dy) one thread may keep in its own cache between passes (Args).
  int64_t cache_budget;
  int64_t stream_bytes;  // dx of at least this many bytes is written with streaming stores
};

template <class T> void run_baseline(const BackwardArgs<T>& a, const ParallelFor& pf);
template <class T> void run_avx2(const BackwardArgs<T>& a, const ParallelFor& pf);
template <class T> void run_avx512(const BackwardArgs<T>& a, const ParallelFor& pf);

}  // namespace opbridge::group_norm_isa
