// A host emulation of the parts of the CUDA runtime and device language that opbridge's kernels
// use, so that the kernel files themselves (ops/*/*_kernel.cu, their launchers included)
// compile with the host compiler and run on the CPU under AddressSanitizer and
// UndefinedBehaviorSanitizer (tests/cuda_ops/test_cuda_host.py). Only for tests: nothing here is built
// into opbridge.
//
// This folder stands in for the CUDA headers (cuda_runtime.h, cuda_runtime_api.h, cuda_fp16.h,
// cuda_bf16.h, cooperative_groups.h) on the include path. What it models:
//   - Every CUDA thread is a fiber with a stack of its own (sim/simt.cpp switches between them);
//     a block's threads take turns on one OS thread, switching only where CUDA threads
//     synchronize or exit. A launch runs its grid one thread-block cluster at a time (a cluster
//     is one block unless the launch asks for more); the blocks of a cluster run together, on OS
//     threads of their own.
//   - __syncthreads() is a barrier over the block's threads that have not exited; every thread
//     must reach it from the same source line (else: "divergent __syncthreads", abort).
//   - Warp shuffles and ballots exchange values through the warp's slots and a barrier over
//     its 32 lanes; a full-warp mask naming a lane that has exited aborts (undefined on a GPU).
//   - Shared memory (OPBRIDGE_SHARED_*, OPBRIDGE_DYNAMIC_SHARED) is one heap buffer of exactly
//     the declared size per block and declaration, filled with 0xff bytes (NaN, -1) when the
//     block starts, freed when its cluster ends: AddressSanitizer reports any access outside it.
//     Static and dynamic shared memory together are limited to 48 KiB per block, as a launch
//     without opt-in is on every GPU.
//   - Device memory is host memory; launches, memsets and allocations run synchronously (every
//     stream is in order, so the order of the work is the same).
//   - The device is configurable (simt::config(): SM count, compute capability) so that the
//     launchers' choices (grid-stride loops over small grids, cluster or not) can be steered.
// Kernel arithmetic runs in the host's float and double, which round like the GPU's for +, -,
// *, / and sqrt; exp and the fast-math intrinsics may differ in the last bits.
#pragma once

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#define OPBRIDGE_SIMT_HOST 1

// ---- the device language's keywords ----------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

// ---- runtime types -----------------------------------------------------------------------------

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNotSupported = 801,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
using cudaError_t = cudaError;

struct CUstream_st;
using cudaStream_t = CUstream_st*;

enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
};

enum cudaLaunchAttributeID { cudaLaunchAttributeClusterDimension = 4 };
union cudaLaunchAttributeValue {
  struct {
    unsigned x, y, z;
  } clusterDim;
};
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
  dim3 gridDim;
  dim3 blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned numAttrs;
};

namespace simt {

// ---- the emulated device -------------------------------------------------------------------

struct Config {
  int sm_count = 4;
  int cc_major = 9;
  int cc_minor = 0;
  size_t shared_limit = 48 * 1024;  // bytes of shared memory per block without opt-in
  unsigned max_cluster = 8;         // portable cluster size
};
inline Config& config() {
  static Config c;
  return c;
}

[[noreturn]] inline void fail(const char* what, const char* detail = "") {
  std::fprintf(stderr, "simt: %s%s\n", what, detail);
  std::fflush(stderr);
  std::abort();
}

// Launches and their outcome, for the harness's report (which kernels ran).
struct Stats {
  std::atomic<int64_t> launches{0};
  std::atomic<int64_t> threads{0};
  std::mutex mu;
  std::vector<const void*> kernels;  // each kernel launched, once
  void launched(const void* kernel) {
    std::lock_guard<std::mutex> lock(mu);
    if (std::find(kernels.begin(), kernels.end(), kernel) == kernels.end()) kernels.push_back(kernel);
  }
};
inline Stats& stats() {
  static Stats s;
  return s;
}

// ---- blocks, warps, clusters -----------------------------------------------------------------

// ---- CUDA threads as fibers -------------------------------------------------------------------
//
// The threads of a block are fibers run by one OS thread, the block's runner, which
// switches between them only where CUDA threads synchronize (__syncthreads, warp exchanges,
// cluster barriers) or exit; the blocks of a cluster have runners of their own, on OS threads
// that meet at the cluster barriers. A barrier that can never complete (threads waiting at
// different barriers) is reported with where every thread waits, instead of hanging.

struct Block;
struct Cluster;

struct Fiber {
  void* sp = nullptr;     // its saved stack pointer while it is not running
  void* stack = nullptr;  // mmap'd, lowest page a guard
  size_t stack_bytes = 0;
  Block* block = nullptr;
  int linear = 0;  // thread index within the block
  int warp = 0, lane = 0;
  uint3 tid{0, 0, 0};
  enum State { kRunnable, kWaiting, kDone } state = kRunnable;
  const char* waits_at = "";  // what a waiting fiber waits for (for the deadlock report)
  int line = 0;               // the __syncthreads line it waits at
  uint64_t exchanges = 0;     // warp exchanges made; the parity picks the slot row
};

// A barrier among some of a block's fibers: the last of `expected` arrivals releases the others.
struct Gate {
  int count = 0;
  std::vector<Fiber*> waiting;
};

struct Warp {
  int lanes = 0;  // lanes of the warp (32 except in a block's last, partial warp)
  int live = 0;   // lanes that have not exited
  Gate gate;
  uint64_t slot[2][32] = {};
  uint64_t seq[2][32] = {};  // which exchange (per-lane count) each slot holds
};

struct Block {
  Block(unsigned index, unsigned rank, int threads, size_t dynamic_bytes, Cluster* cluster)
      : index(index), rank(rank), threads(threads), live(threads), dynamic_bytes(dynamic_bytes), cluster(cluster),
        fibers(static_cast<size_t>(threads)) {
    for (int w = 0; w * 32 < threads; ++w) {
      Warp wp;
      wp.lanes = wp.live = std::min(32, threads - w * 32);
      warps.push_back(wp);
    }
  }
  ~Block() {
    for (auto& kv : shared) std::free(kv.second.first);
    std::free(dynamic);
  }
  // The buffer of one shared-memory declaration (site), allocated by the first thread to reach it.
  void* shared_buffer(const void* site_key, size_t bytes, size_t align) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = shared.find(site_key);
    if (it != shared.end()) {
      if (it->second.second != bytes) fail("a shared-memory declaration changed size within a block");
      return it->second.first;
    }
    shared_bytes += bytes;
    if (shared_bytes + dynamic_bytes > config().shared_limit) fail("more than 48 KiB of shared memory in one block");
    void* p = nullptr;
    if (posix_memalign(&p, std::max<size_t>(align, sizeof(void*)), bytes == 0 ? 1 : bytes) != 0) fail("out of memory");
    std::memset(p, 0xff, bytes);
    shared.emplace(site_key, std::make_pair(p, bytes));
    return p;
  }
  void* dynamic_buffer() {
    std::lock_guard<std::mutex> lock(mu);
    if (dynamic == nullptr && dynamic_bytes > 0) {
      if (posix_memalign(&dynamic, 16, dynamic_bytes) != 0) fail("out of memory");
      std::memset(dynamic, 0xff, dynamic_bytes);
    }
    return dynamic;
  }
  // The address in this block's buffers that corresponds to `p` in `other`'s (distributed
  // shared memory within a cluster).
  void* map_from(Block& other, const void* p) {
    const void* key = nullptr;
    size_t offset = 0;
    const char* q = static_cast<const char*>(p);
    {
      std::lock_guard<std::mutex> lock(other.mu);
      for (auto& kv : other.shared) {
        const char* b = static_cast<const char*>(kv.second.first);
        if (q >= b && q < b + kv.second.second) {
          key = kv.first;
          offset = static_cast<size_t>(q - b);
        }
      }
      const char* d = static_cast<const char*>(other.dynamic);
      if (key == nullptr && d != nullptr && q >= d && q < d + other.dynamic_bytes) {
        offset = static_cast<size_t>(q - d);
        key = &other.dynamic;
      }
    }
    if (key == nullptr) fail("map_shared_rank of an address that is not in the block's shared memory");
    if (key == &other.dynamic) return static_cast<char*>(dynamic_buffer()) + offset;
    std::lock_guard<std::mutex> lock(mu);
    auto it = shared.find(key);
    if (it == shared.end()) fail("map_shared_rank: the other block has not declared that shared memory yet");
    return static_cast<char*>(it->second.first) + offset;
  }

  unsigned index, rank;
  int threads;
  int live;  // threads that have not exited
  size_t dynamic_bytes;
  Cluster* cluster;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Gate sync_gate;     // __syncthreads
  Gate cluster_gate;  // this block's part of cluster.sync()
  void* runner_sp = nullptr;  // the runner's saved stack pointer while a thread runs
  const void* runner_stack = nullptr;  // its stack, for AddressSanitizer's fiber switches
  size_t runner_stack_bytes = 0;
  Fiber* current = nullptr;
  std::mutex mu;  // guards `shared` and `dynamic` (read by the cluster's other runners)
  std::map<const void*, std::pair<void*, size_t>> shared;
  size_t shared_bytes = 0;
  void* dynamic = nullptr;
};

struct Cluster {
  explicit Cluster(int blocks) : bar(blocks) {}
  std::vector<std::unique_ptr<Block>> blocks;
  std::barrier<> bar;  // the blocks' runners meet here for cluster.sync()
};

inline thread_local Block* t_block = nullptr;  // the block this OS thread runs

inline Fiber& current() {
  if (t_block == nullptr || t_block->current == nullptr) fail("a device function ran outside a kernel launch");
  return *t_block->current;
}

}  // namespace simt

// sim/simt.cpp: saves the callee-saved registers and the stack pointer in *save_sp, continues
// on load_sp (a stack saved by simt_switch, or a new one set up by simt::start_stack).
extern "C" void simt_switch(void** save_sp, void* load_sp);
extern "C" void simt_trampoline();

namespace simt {

// Switches from the running stack to the one saved in `to_sp` (AddressSanitizer is told about
// the stack change).
inline void switch_context(void** from_sp, void* to_sp, const void* to_stack, size_t to_bytes) {
#if defined(__SANITIZE_ADDRESS__)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, to_stack, to_bytes);
  simt_switch(from_sp, to_sp);
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
  (void)to_stack;
  (void)to_bytes;
  simt_switch(from_sp, to_sp);
#endif
}

// The running fiber gives the runner back its turn (it has blocked or finished).
inline void yield_to_runner() {
  Block& b = *t_block;
  Fiber& f = *b.current;
  switch_context(&f.sp, b.runner_sp, b.runner_stack, b.runner_stack_bytes);
}

// Arrives at `g`, which completes when `expected` fibers have arrived; `check` runs once, when
// it completes, over the arrivals (the last one included). Returns once the gate has completed.
template <class Check>
void arrive(Gate& g, int expected, const char* what, Check check) {
  Fiber& f = current();
  if (++g.count < expected) {
    f.state = Fiber::kWaiting;
    f.waits_at = what;
    g.waiting.push_back(&f);
    yield_to_runner();
    return;
  }
  check(g, f);
  for (Fiber* w : g.waiting) w->state = Fiber::kRunnable;
  g.waiting.clear();
  g.count = 0;
}
inline void no_check(Gate&, Fiber&) {}

// All threads of the block waiting at __syncthreads must wait at the same one.
inline void same_line(Gate& g, Fiber& last) {
  for (Fiber* w : g.waiting) {
    if (w->line != last.line) {
      std::fprintf(stderr, "simt: divergent __syncthreads in block %u: thread %d at line %d, thread %d at line %d\n",
                   last.block->index, w->linear, w->line, last.linear, last.line);
      std::fflush(stderr);
      std::abort();
    }
  }
}

inline void cluster_arrive_last(Gate&, Fiber& f);

// After a thread exits, gates that were waiting only for it complete.
inline void release_after_exit(Block& b, Fiber& f) {
  auto release = [](Gate& g) {
    for (Fiber* w : g.waiting) w->state = Fiber::kRunnable;
    g.waiting.clear();
    g.count = 0;
  };
  Warp& w = b.warps[static_cast<size_t>(f.warp)];
  if (w.gate.count > 0 && w.gate.count >= w.live) release(w.gate);
  if (b.sync_gate.count > 0 && b.sync_gate.count >= b.live) {
    same_line(b.sync_gate, *b.sync_gate.waiting.back());
    release(b.sync_gate);
  }
  if (b.cluster_gate.count > 0 && b.cluster_gate.count >= b.live) {
    b.cluster->bar.arrive_and_wait();
    release(b.cluster_gate);
  }
}

// ---- __syncthreads and warp exchanges --------------------------------------------------------

inline void syncthreads(int line) {
  Fiber& f = current();
  f.line = line;
  arrive(f.block->sync_gate, f.block->live, "__syncthreads", same_line);
}

// cluster.sync(): the block's threads meet, then the last one meets the other blocks' runners.
inline void cluster_arrive_last(Gate&, Fiber& f) { f.block->cluster->bar.arrive_and_wait(); }
inline void cluster_sync() {
  Fiber& f = current();
  arrive(f.block->cluster_gate, f.block->live, "cluster.sync()", cluster_arrive_last);
}

// Every lane of the warp publishes `mine` and gets the warp's slots back (valid until the
// warp's next exchange). `mask` must name exactly the warp's lanes, none of which has exited.
inline const uint64_t* warp_exchange(unsigned mask, uint64_t mine) {
  Fiber& f = current();
  Warp& w = f.block->warps[static_cast<size_t>(f.warp)];
  const uint32_t lanes = w.lanes == 32 ? 0xffffffffu : ((1u << w.lanes) - 1u);
  if ((mask & lanes) != lanes) fail("a warp-synchronous call whose mask leaves out lanes of the warp");
  // Two rows of slots, used alternately: a lane writes a row again only after the exchange in
  // between has completed, which every lane reaches after reading this one.
  const uint64_t n = ++f.exchanges;
  const unsigned row = static_cast<unsigned>(n & 1u);
  w.slot[row][f.lane] = mine;
  w.seq[row][f.lane] = n;
  arrive(w.gate, w.live, "a warp exchange", no_check);
  for (int l = 0; l < w.lanes; ++l) {
    // A lane that has exited (or is at another exchange) did not write this one.
    if (w.seq[row][l] != n) fail("a warp-synchronous call that not every lane of the warp reached (exited or diverged)");
  }
  return w.slot[row];
}

template <class T>
uint64_t to_slot(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffles move at most 8 bytes");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof v);
  return u;
}
template <class T>
T from_slot(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

// ---- shared memory ---------------------------------------------------------------------------

template <class T>
T* shared_array(const void* site_key, size_t count) {
  return static_cast<T*>(current().block->shared_buffer(site_key, count * sizeof(T), alignof(T)));
}
template <class T>
T* dynamic_shared() {
  return static_cast<T*>(current().block->dynamic_buffer());
}

// ---- launches --------------------------------------------------------------------------------

cudaError_t run_grid(const cudaLaunchConfig_t& cfg, std::function<void()> body);

}  // namespace simt

// ---- built-in variables ----------------------------------------------------------------------

// The runner sets them before it switches to a thread (each runner is an OS thread of its own).
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim{0, 0, 0};
inline thread_local dim3 gridDim{0, 0, 0};

#define __syncthreads() ::simt::syncthreads(__LINE__)

// Shared memory declarations (cuda/common/launch.cuh defines the device forms).
#define OPBRIDGE_SHARED_ARRAY(T, name, count) \
  static const char name##_site_ = 0;         \
  T* const name = ::simt::shared_array<T>(&name##_site_, (count))
#define OPBRIDGE_SHARED_VAR(T, name)  \
  static const char name##_site_ = 0; \
  T& name = *::simt::shared_array<T>(&name##_site_, 1)
#define OPBRIDGE_DYNAMIC_SHARED(T, name) T* const name = ::simt::dynamic_shared<T>()

// ---- warp intrinsics -------------------------------------------------------------------------

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = ::simt::current().lane;
  const int s = (lane & ~(width - 1)) | (src & (width - 1));
  return ::simt::from_slot<T>(::simt::warp_exchange(mask, ::simt::to_slot(v))[s]);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::simt::current().lane;
  const int s = lane ^ lane_mask;
  const int seg_end = (lane / width + 1) * width;  // a lane of a later segment: own value
  const uint64_t* slots = ::simt::warp_exchange(mask, ::simt::to_slot(v));
  return s >= seg_end ? v : ::simt::from_slot<T>(slots[s]);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::simt::current().lane;
  const int s = lane + static_cast<int>(delta);
  const int seg_end = (lane / width + 1) * width;
  const uint64_t* slots = ::simt::warp_exchange(mask, ::simt::to_slot(v));
  return s >= seg_end ? v : ::simt::from_slot<T>(slots[s]);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  const uint64_t* slots = ::simt::warp_exchange(mask, pred != 0 ? 1u : 0u);
  unsigned bits = 0;
  const int lanes = ::simt::current().block->warps[static_cast<size_t>(::simt::current().warp)].lanes;
  for (int l = 0; l < lanes; ++l) bits |= (slots[l] != 0 ? 1u : 0u) << l;
  return bits & mask;
}

// ---- arithmetic and bit intrinsics -----------------------------------------------------------

inline unsigned __float_as_uint(float v) { return ::simt::from_slot<unsigned>(::simt::to_slot(v)); }
inline float __int_as_float(int v) { return ::simt::from_slot<float>(::simt::to_slot(v)); }
inline float __uint_as_float(unsigned v) { return ::simt::from_slot<float>(::simt::to_slot(v)); }
inline long long __double_as_longlong(double v) { return ::simt::from_slot<long long>(::simt::to_slot(v)); }
inline double __longlong_as_double(long long v) { return ::simt::from_slot<double>(::simt::to_slot(v)); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32);
}
inline float __fdividef(float a, float b) { return a / b; }
[[noreturn]] inline void __trap() { ::simt::fail("__trap() in a kernel"); }

using std::exp;
using std::floor;
using std::isfinite;
using std::isnan;
using std::max;
using std::min;
using std::sqrt;
inline float expf(float v) { return std::exp(v); }
inline float floorf(float v) { return std::floor(v); }
// CUDA's min/max take mixed integer widths; the kernels only mix int64_t with int64_t.

namespace simt {
// PTX's abs.f32 / abs.f64 return "an unspecified NaN" for a NaN input: the sign bit of the result
// is not guaranteed to be clear (GPUs return NaNs with the sign bit set). The emulation takes that
// permitted, least convenient result, so code that relies on fabs clearing the sign of a NaN
// fails here as it can on a GPU.
template <class T>
T ptx_abs(T v) {
  return std::isnan(v) ? -std::numeric_limits<T>::quiet_NaN() : std::fabs(v);
}
}  // namespace simt
#define fabs(v) ::simt::ptx_abs<double>(v)
#define fabsf(v) ::simt::ptx_abs<float>(v)

// Explicitly rounded arithmetic (the kernels use it where a fused multiply-add would round
// differently from the CPU kernels).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }

// ---- atomics ---------------------------------------------------------------------------------

inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  std::atomic_ref<unsigned long long> a(*p);
  unsigned long long old = a.load();
  while (v < old && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline double atomicAdd(double* p, double v) { return std::atomic_ref<double>(*p).fetch_add(v); }

// ---- runtime API -----------------------------------------------------------------------------

inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
  }
  return "cudaError(unknown)";
}
inline const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidValue;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *v = simt::config().sm_count; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = simt::config().cc_major; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *v = simt::config().cc_minor; return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  if (p == nullptr && bytes > 0) return cudaErrorInvalidValue;
  if (bytes > 0) std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) {
  if (posix_memalign(p, 256, bytes == 0 ? 1 : bytes) != 0) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xff, bytes);  // device memory starts with whatever was there
  return cudaSuccess;
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  std::free(p);
  return cudaSuccess;
}
// Every launch has run by the time it returns: copies and synchronization are immediate.
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  if ((dst == nullptr || src == nullptr) && bytes > 0) return cudaErrorInvalidValue;
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

// Blocks per cluster that the launch asks for (1 without the attribute).
inline unsigned simt_cluster_size(const cudaLaunchConfig_t& cfg) {
  for (unsigned i = 0; i < cfg.numAttrs; ++i) {
    if (cfg.attrs[i].id == cudaLaunchAttributeClusterDimension) return cfg.attrs[i].val.clusterDim.x;
  }
  return 1;
}

template <class... Params>
cudaError_t cudaOccupancyMaxActiveClusters(int* clusters, void (*)(Params...), const cudaLaunchConfig_t* cfg) {
  const unsigned k = simt_cluster_size(*cfg);
  *clusters = (simt::config().cc_major >= 9 && k <= simt::config().max_cluster) ? simt::config().sm_count / k + 1 : 0;
  return cudaSuccess;
}

template <class... Params, class... Args>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* cfg, void (*kernel)(Params...), Args&&... args) {
  // The kernel's parameters, converted once as the launch does; each thread gets copies.
  simt::stats().launched(reinterpret_cast<const void*>(kernel));
  auto params = std::make_shared<std::tuple<std::decay_t<Params>...>>(std::forward<Args>(args)...);
  return simt::run_grid(*cfg, [kernel, params]() { std::apply(kernel, *params); });
}

#include "simt_run.h"
