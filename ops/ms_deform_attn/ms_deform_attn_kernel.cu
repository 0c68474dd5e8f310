// MultiScaleDeformableAttention CUDA kernels and their launchers (see ms_deform_attn.cuh; the
// per-thread math is in ms_deform_attn_math.cuh).
//
// Forward: one thread per output vector (VEC consecutive elements of D of one query and head),
// consecutive threads on consecutive vectors, so the loads of a tap (the value row of one spatial
// position and head) are coalesced over D; 128-bit accesses where D and the pointers allow. The
// locations and weights of a query are the same address for its D / VEC threads (one broadcast
// load). Accumulation in float (double for double).
//
// Backward: G lanes per query and head (see the math header). grad_value is a scatter: atomic
// adds into a zero-filled buffer, float4/float2 vector atomics on sm_90+; for the 16-bit types
// into a float workspace, converted at the end, so that many small contributions do not round
// away. grad_sampling_locations and grad_attention_weights are reductions over D: warp shuffles
// within the G lanes, written once by lane 0 (no atomics, fully written).
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "ms_deform_attn.cuh"

namespace opbridge::cuda {
namespace msda {

// p[i] += v[i], i < VEC, each element atomically (sm_90+: one vector atomic per 2 or 4 floats).
template <int VEC, class GV, class A>
__device__ __forceinline__ void atomic_add_vec(GV* p, const A* v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kVector = std::is_same_v<GV, float> && (VEC == 2 || VEC % 4 == 0);
#else
  constexpr bool kVector = false;
#endif
  if constexpr (kVector && VEC == 2) {
    atomicAdd(reinterpret_cast<float2*>(p), make_float2(v[0], v[1]));
  } else if constexpr (kVector) {
#pragma unroll
    for (int k = 0; k < VEC; k += 4) {
      atomicAdd(reinterpret_cast<float4*>(p + k), make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]));
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) atomicAdd(p + k, static_cast<GV>(v[k]));
  }
}

}  // namespace msda
}  // namespace opbridge::cuda

#include "ms_deform_attn_math.cuh"

namespace opbridge::cuda {
namespace {

using msda::Levels;
using msda::Sample;
using msda::Shape;

static_assert(msda::kMaxLevels == kMsDeformAttnMaxLevels, "the kernels' level table must hold every level");

constexpr int kBlock = 256;
constexpr unsigned kFullMask = 0xffffffffu;
// Grid-stride loops launch at most this many blocks per SM.
constexpr int64_t kMaxBlocksPerSm = 32;

template <class D, int VEC>
__global__ void __launch_bounds__(kBlock)
    ms_deform_attn_forward_kernel(const D* __restrict__ value, const D* __restrict__ loc,
                                  const D* __restrict__ attn, D* __restrict__ out, Levels lv, Shape z,
                                  int64_t total) {
  using A = acc<D>;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    A o[VEC];
    msda::forward_vector<VEC, D, A>(value, loc, attn, lv, z, idx, o);
    msda::Vec<D, VEC> pk;
#pragma unroll
    for (int k = 0; k < VEC; ++k) pk.v[k] = from_acc<D>(o[k]);
    // output is [N * Lq * M, D]: vector idx starts at element idx * VEC.
    *reinterpret_cast<msda::Vec<D, VEC>*>(out + idx * VEC) = pk;
  }
}

// G lanes per query and head r (G a power of two <= 32, aligned within the warp).
//   gv: grad_value or its float workspace (nullptr: not wanted); gloc, gattn: may be nullptr
template <class D, int VEC, class GV>
__global__ void __launch_bounds__(kBlock)
    ms_deform_attn_backward_kernel(const D* __restrict__ grad_out, const D* __restrict__ value,
                                   const D* __restrict__ loc, const D* __restrict__ attn, GV* gv,
                                   D* __restrict__ gloc, D* __restrict__ gattn, Levels lv, Shape z, int G,
                                   int64_t queries) {
  using A = acc<D>;
  const int lane = static_cast<int>(threadIdx.x) & (G - 1);
  const int64_t sub = threadIdx.x / G;
  const int64_t per_block = blockDim.x / G;
  const int64_t row = z.M * z.D;
  const int64_t LP = z.L * z.P;
  const bool reduce = gloc != nullptr || gattn != nullptr;
  // `base` advances uniformly over the block, so every lane of a warp runs the same iterations
  // and reaches every shuffle; lanes past the last query carry zeros.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * per_block; base < queries;
       base += static_cast<int64_t>(gridDim.x) * per_block) {
    const int64_t r = base + sub;
    const bool active = r < queries;
    const int64_t rr = active ? r : 0;
    const int64_t vb = msda::value_base(z, rr);
    const D* lp = loc + rr * LP * 2;
    const D* ap = attn + rr * LP;
    for (int l = 0; l < z.L; ++l) {
      const int H = lv.h[l], W = lv.w[l];
      const int64_t start = lv.start[l];
      for (int64_t p = 0; p < z.P; ++p) {
        const int64_t j = l * z.P + p;
        A sv = A(0), sx = A(0), sy = A(0), a = A(0);
        bool valid = false;
        if (active) {
          Sample<A> s;
          valid = msda::setup_sample<A>(to_acc(lp[2 * j]), to_acc(lp[2 * j + 1]), H, W, start, row, &s);
          if (valid) {
            a = to_acc(ap[j]);
            msda::backward_sample<VEC, D, A, GV>(value + vb, grad_out + rr * z.D, gv == nullptr ? nullptr : gv + vb,
                                                 z.DV, lane, G, a, s, &sv, &sx, &sy);
          }
        }
        if (!reduce) continue;  // uniform
        for (int off = G >> 1; off > 0; off >>= 1) {
          sv += __shfl_xor_sync(kFullMask, sv, off);
          sx += __shfl_xor_sync(kFullMask, sx, off);
          sy += __shfl_xor_sync(kFullMask, sy, off);
        }
        if (active && lane == 0) {
          A g_attn, g_x, g_y;
          msda::sample_grads<A>(valid, a, H, W, sv, sx, sy, &g_attn, &g_x, &g_y);
          if (gattn != nullptr) gattn[rr * LP + j] = from_acc<D>(g_attn);
          if (gloc != nullptr) {
            gloc[2 * (rr * LP + j)] = from_acc<D>(g_x);
            gloc[2 * (rr * LP + j) + 1] = from_acc<D>(g_y);
          }
        }
      }
    }
  }
}

// dst[i] = src[i] (float workspace -> 16-bit grad_value).
template <class D>
__global__ void __launch_bounds__(kBlock) ms_deform_attn_convert_kernel(const float* __restrict__ src,
                                                                        D* __restrict__ dst, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = from_acc<D>(src[i]);
  }
}

// ---- host side -----------------------------------------------------------------------------

// Re-checks what memory safety depends on and builds the kernels' level table and sizes.
cudaError_t prepare(const MsDeformAttnDims& d, const int64_t* shapes, const int64_t* starts, Levels* lv, Shape* z) {
  if (d.N < 0 || d.S < 0 || d.M < 0 || d.D < 0 || d.Lq < 0 || d.P < 0 || d.L < 0 || d.L > msda::kMaxLevels) {
    return cudaErrorInvalidValue;
  }
  if (d.L > 0 && (shapes == nullptr || starts == nullptr)) return cudaErrorInvalidValue;
  *lv = Levels{};
  for (int64_t l = 0; l < d.L; ++l) {
    const int64_t h = shapes[2 * l], w = shapes[2 * l + 1], s0 = starts[l];
    // Taps are indexed in 32 bits per axis; a level must lie inside [0, S).
    if (h < 0 || w < 0 || h >= (int64_t{1} << 31) - 1 || w >= (int64_t{1} << 31) - 1 || s0 < 0 || s0 > d.S ||
        h * w > d.S - s0) {
      return cudaErrorInvalidValue;
    }
    lv->h[l] = static_cast<int32_t>(h);
    lv->w[l] = static_cast<int32_t>(w);
    lv->start[l] = s0;
  }
  *z = Shape{d.N, d.S, d.M, d.D, d.Lq, d.L, d.P, 0};
  return cudaSuccess;
}

int64_t grid_for(const DeviceInfo& dev, int64_t threads) {
  return std::max<int64_t>(1, std::min(ceil_div(threads, kBlock), dev.sm_count * kMaxBlocksPerSm));
}

// The widest vector (elements, up to 16 bytes) that divides D and that every pointer is
// aligned for; the kernels are instantiated for that width and for 1.
template <class D>
constexpr int kMaxVec = 16 / static_cast<int>(sizeof(D));

template <class D>
bool vec_ok(int64_t Dn, std::initializer_list<std::pair<const void*, size_t>> ptrs) {
  if (Dn % kMaxVec<D> != 0) return false;
  for (const auto& [p, elem] : ptrs) {
    if (p != nullptr && !aligned_to(p, kMaxVec<D> * elem)) return false;
  }
  return true;
}

template <class D, int VEC>
cudaError_t forward(Stream stream, const DeviceInfo& dev, const D* value, const D* loc, const D* attn, D* out,
                    const Levels& lv, Shape z) {
  z.DV = z.D / VEC;
  const int64_t total = z.N * z.Lq * z.M * z.DV;
  const LaunchShape shape{dim3(static_cast<unsigned>(grid_for(dev, total))), dim3(kBlock), 0, 1};
  return launch(ms_deform_attn_forward_kernel<D, VEC>, shape, stream, value, loc, attn, out, lv, z, total);
}

template <class D, int VEC, class GV>
cudaError_t backward(Stream stream, const DeviceInfo& dev, const D* go, const D* value, const D* loc, const D* attn,
                     GV* gv, D* gloc, D* gattn, const Levels& lv, Shape z) {
  z.DV = z.D / VEC;
  const int G = next_pow2(std::max<int64_t>(1, std::min<int64_t>(z.DV, 32)));
  const int64_t queries = z.N * z.Lq * z.M;
  const LaunchShape shape{dim3(static_cast<unsigned>(grid_for(dev, queries * G))), dim3(kBlock), 0, 1};
  return launch(ms_deform_attn_backward_kernel<D, VEC, GV>, shape, stream, go, value, loc, attn, gv, gloc, gattn, lv,
                z, G, queries);
}

}  // namespace

template <class T>
cudaError_t launch_ms_deform_attn(cudaStream_t stream_handle, const T* value, const int64_t* spatial_shapes_host,
                                  const int64_t* level_start_index_host, const T* sampling_locations,
                                  const T* attention_weights, T* output, const MsDeformAttnDims& d) {
  using D = typename DeviceType<T>::type;
  Levels lv;
  Shape z;
  cudaError_t e = prepare(d, spatial_shapes_host, level_start_index_host, &lv, &z);
  if (e != cudaSuccess) return e;
  if (d.N == 0 || d.Lq == 0 || d.M == 0 || d.D == 0) return cudaSuccess;  // empty output
  DeviceInfo dev;
  e = current_device_info(&dev);
  if (e != cudaSuccess) return e;
  const Stream stream{stream_handle};
  const D* v = reinterpret_cast<const D*>(value);
  const D* loc = reinterpret_cast<const D*>(sampling_locations);
  const D* attn = reinterpret_cast<const D*>(attention_weights);
  D* out = reinterpret_cast<D*>(output);
  if (vec_ok<D>(d.D, {{value, sizeof(D)}, {output, sizeof(D)}})) {
    return forward<D, kMaxVec<D>>(stream, dev, v, loc, attn, out, lv, z);
  }
  return forward<D, 1>(stream, dev, v, loc, attn, out, lv, z);
}

template <class T>
size_t ms_deform_attn_backward_workspace_bytes(const MsDeformAttnDims& d) {
  if constexpr (sizeof(T) == 2) {
    if (d.N <= 0 || d.S <= 0 || d.M <= 0 || d.D <= 0) return 0;
    return static_cast<size_t>(d.N * d.S * d.M * d.D) * sizeof(float);
  } else {
    (void)d;
    return 0;
  }
}

template <class T>
cudaError_t launch_ms_deform_attn_backward(cudaStream_t stream_handle, const T* grad_output, const T* value,
                                           const int64_t* spatial_shapes_host,
                                           const int64_t* level_start_index_host, const T* sampling_locations,
                                           const T* attention_weights, T* grad_value,
                                           T* grad_sampling_locations, T* grad_attention_weights,
                                           const MsDeformAttnDims& d, void* workspace, size_t workspace_bytes) {
  using D = typename DeviceType<T>::type;
  // grad_value's accumulation type: float for the 16-bit types (in the workspace), else T.
  using GV = std::conditional_t<sizeof(T) == 2, float, D>;
  constexpr bool kViaWorkspace = sizeof(T) == 2;
  Levels lv;
  Shape z;
  cudaError_t e = prepare(d, spatial_shapes_host, level_start_index_host, &lv, &z);
  if (e != cudaSuccess) return e;
  const Stream stream{stream_handle};
  const int64_t value_numel = d.N * d.S * d.M * d.D;
  const bool want_gv = grad_value != nullptr && value_numel > 0;

  GV* gv = nullptr;
  void* owned = nullptr;  // allocated here (no caller workspace), freed on the stream below
  if (want_gv) {
    if constexpr (kViaWorkspace) {
      const size_t need = ms_deform_attn_backward_workspace_bytes<T>(d);
      if (workspace == nullptr) {
        e = cudaMallocAsync(&owned, need, stream.get());
        if (e != cudaSuccess) return e;
        gv = static_cast<GV*>(owned);
      } else {
        if (workspace_bytes < need || !aligned_to(workspace, 16)) return cudaErrorInvalidValue;
        gv = static_cast<GV*>(workspace);
      }
    } else {
      (void)workspace;
      (void)workspace_bytes;
      gv = reinterpret_cast<GV*>(grad_value);
    }
    e = cudaMemsetAsync(gv, 0, static_cast<size_t>(value_numel) * sizeof(GV), stream.get());
  }

  const int64_t queries = d.N * d.Lq * d.M;
  if (e == cudaSuccess && queries > 0 && d.L > 0 && d.P > 0 && d.D > 0 &&
      (want_gv || grad_sampling_locations != nullptr || grad_attention_weights != nullptr)) {
    DeviceInfo dev;
    e = current_device_info(&dev);
    if (e == cudaSuccess) {
      const D* go = reinterpret_cast<const D*>(grad_output);
      const D* v = reinterpret_cast<const D*>(value);
      const D* loc = reinterpret_cast<const D*>(sampling_locations);
      const D* attn = reinterpret_cast<const D*>(attention_weights);
      D* gloc = reinterpret_cast<D*>(grad_sampling_locations);
      D* gattn = reinterpret_cast<D*>(grad_attention_weights);
      // The vector width must suit the float workspace too (kMaxVec<D> floats from a multiple of
      // kMaxVec<D> elements: 16-byte aligned when the workspace is).
      if (vec_ok<D>(d.D, {{value, sizeof(D)}, {grad_output, sizeof(D)}, {gv, sizeof(GV)}})) {
        e = backward<D, kMaxVec<D>, GV>(stream, dev, go, v, loc, attn, gv, gloc, gattn, lv, z);
      } else {
        e = backward<D, 1, GV>(stream, dev, go, v, loc, attn, gv, gloc, gattn, lv, z);
      }
    }
  }
  if constexpr (kViaWorkspace) {
    if (e == cudaSuccess && want_gv) {
      DeviceInfo dev;
      e = current_device_info(&dev);
      if (e == cudaSuccess) {
        const LaunchShape shape{dim3(static_cast<unsigned>(grid_for(dev, value_numel))), dim3(kBlock), 0, 1};
        e = launch(ms_deform_attn_convert_kernel<D>, shape, stream, static_cast<const float*>(gv),
                   reinterpret_cast<D*>(grad_value), value_numel);
      }
    }
  }
  // grad_sampling_locations / grad_attention_weights are fully written by the kernel, except when
  // D == 0 (sums over nothing: zeros, written here) or they are empty (L, P or queries are 0).
  if (e == cudaSuccess && queries > 0 && d.L > 0 && d.P > 0 && d.D == 0) {
    const size_t lp = static_cast<size_t>(queries * d.L * d.P);
    if (grad_sampling_locations != nullptr) {
      e = cudaMemsetAsync(grad_sampling_locations, 0, 2 * lp * sizeof(T), stream.get());
    }
    if (e == cudaSuccess && grad_attention_weights != nullptr) {
      e = cudaMemsetAsync(grad_attention_weights, 0, lp * sizeof(T), stream.get());
    }
  }
  if (owned != nullptr) {
    const cudaError_t f = cudaFreeAsync(owned, stream.get());
    if (e == cudaSuccess) e = f;
  }
  return e;
}

#define OPBRIDGE_INSTANTIATE_MS_DEFORM_ATTN_CUDA(T)                                                               \
  template cudaError_t launch_ms_deform_attn<T>(cudaStream_t, const T*, const int64_t*, const int64_t*, const T*, \
                                                const T*, T*, const MsDeformAttnDims&);                         \
  template size_t ms_deform_attn_backward_workspace_bytes<T>(const MsDeformAttnDims&);                            \
  template cudaError_t launch_ms_deform_attn_backward<T>(cudaStream_t, const T*, const T*, const int64_t*,         \
                                                         const int64_t*, const T*, const T*, T*, T*, T*,           \
                                                         const MsDeformAttnDims&, void*, size_t);

OPBRIDGE_FOR_EACH_FLOAT_TYPE(OPBRIDGE_INSTANTIATE_MS_DEFORM_ATTN_CUDA)

// ---- the compute functions (opbridge/kernel.h) -------------------------------------------------
// spatial_shapes and level_start_index are host_memory() inputs: the frameworks hand them over on
// the host (ORT keeps or copies them there; torch reads CPU tensors directly, copies CUDA ones
// once), where the declaration's checks have read them and the launchers take them by value: no
// device-to-host copy and no synchronization here.

namespace {

Status forward(const KernelCall& k) {
  const MsDeformAttnDims d = ms_deform_attn_params(k);
  if (d.N == 0 || d.Lq == 0 || d.M == 0 || d.D == 0) return Status::Ok();  // an empty output
  return dispatch<float, double, Half, BFloat16>(k.type("value"), [&](auto tag) {
    using T = decltype(tag);
    return cuda_status(launch_ms_deform_attn<T>(static_cast<cudaStream_t>(k.stream()), k.in<T>("value"),
                                                k.in<int64_t>("spatial_shapes"), k.in<int64_t>("level_start_index"),
                                                k.in<T>("sampling_locations"), k.in<T>("attention_weights"),
                                                k.out<T>(0), d));
  });
}

Status backward(const KernelCall& k) {
  const MsDeformAttnDims d = ms_deform_attn_params(k);
  return dispatch<float, double, Half, BFloat16>(k.type("value"), [&](auto tag) {
    using T = decltype(tag);
    // The 16-bit types accumulate grad_value in a float workspace, from the framework's allocator.
    const size_t ws_bytes = ms_deform_attn_backward_workspace_bytes<T>(d);
    void* ws = k.scratch(ws_bytes);
    return cuda_status(launch_ms_deform_attn_backward<T>(
        static_cast<cudaStream_t>(k.stream()), k.in<T>("grad_output"), k.in<T>("value"),
        k.in<int64_t>("spatial_shapes"), k.in<int64_t>("level_start_index"), k.in<T>("sampling_locations"),
        k.in<T>("attention_weights"), k.out<T>(0), k.out<T>(1), k.out<T>(2), d, ws, ws_bytes));
  });
}

}  // namespace

}  // namespace opbridge::cuda

OPBRIDGE_KERNEL(opbridge::ms_deform_attn_decl, kCuda, opbridge::cuda::forward);
OPBRIDGE_KERNEL(opbridge::ms_deform_attn_backward_decl, kCuda, opbridge::cuda::backward);
