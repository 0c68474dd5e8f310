// MultiScaleDeformableAttention CPU kernels: framework-free, shared by the torch op, the ORT op
// and opbridge._core. The validation every adapter runs (ms_deform_attn_check) lives here too.
//
// The kernels themselves are in ms_deform_attn_simd.h, compiled once per instruction set: here
// for the baseline, in ms_deform_attn_cpu_avx2.cpp / _avx512.cpp with those flags.
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "common/simd_generic.h"
#include "ms_deform_attn_isa.h"
#include "ms_deform_attn_simd.h"
#include "opbridge/cpu_isa.h"
#include "opbridge/ms_deform_attn.h"

namespace opbridge {

namespace {

bool is_float_type(const char* t) {
  return std::strcmp(t, "float32") == 0 || std::strcmp(t, "float64") == 0 || std::strcmp(t, "float16") == 0 ||
         std::strcmp(t, "bfloat16") == 0;
}

// "[2, 100, ?, 32]": a shape for messages, unknown dimensions as "?".
std::string shape_str(const MsDeformAttnArg& a) {
  std::string s = "[";
  for (int64_t i = 0; i < a.rank; ++i) {
    if (i > 0) s += ", ";
    s += a.shape[i] >= 0 ? std::to_string(a.shape[i]) : "?";
  }
  return s + "]";
}

// Dimension i of a (-1 when the rank or the dimension is unknown).
int64_t dim(const MsDeformAttnArg& a, int64_t i) { return a.rank > i && a.shape != nullptr ? a.shape[i] : -1; }

// Whether two dimensions may be equal (either unknown, or both known and equal).
bool agree(int64_t a, int64_t b) { return a < 0 || b < 0 || a == b; }

// The first of the dimensions that is known, or -1.
int64_t first_known(std::initializer_list<int64_t> dims) {
  for (int64_t v : dims) {
    if (v >= 0) return v;
  }
  return -1;
}

Status check_types(const MsDeformAttnArg& value, const MsDeformAttnArg& spatial_shapes,
                   const MsDeformAttnArg& level_start_index, const MsDeformAttnArg& sampling_locations,
                   const MsDeformAttnArg& attention_weights, const MsDeformAttnArg* grad_output) {
  if (value.dtype != nullptr && !is_float_type(value.dtype)) {
    return Status::TypeError(std::string("value must be a float32, float64, float16 or bfloat16 tensor, got ") +
                             value.dtype);
  }
  const std::pair<const MsDeformAttnArg*, const char*> same[] = {
      {&sampling_locations, "sampling_locations"}, {&attention_weights, "attention_weights"}, {grad_output, "grad_output"}};
  for (const auto& [arg, name] : same) {
    if (arg == nullptr || arg->dtype == nullptr) continue;
    if (value.dtype != nullptr && std::strcmp(arg->dtype, value.dtype) != 0) {
      return Status::TypeError(std::string(name) + " must have the dtype of value (" + value.dtype + "), got " +
                               arg->dtype);
    }
    if (value.dtype == nullptr && !is_float_type(arg->dtype)) {
      return Status::TypeError(std::string(name) +
                               " must be a float32, float64, float16 or bfloat16 tensor, got " + arg->dtype);
    }
  }
  const std::pair<const MsDeformAttnArg*, const char*> ints[] = {{&spatial_shapes, "spatial_shapes"},
                                                                   {&level_start_index, "level_start_index"}};
  for (const auto& [arg, name] : ints) {
    if (arg->dtype != nullptr && std::strcmp(arg->dtype, "int64") != 0) {
      return Status::TypeError(std::string(name) + " must be an int64 tensor, got " + arg->dtype);
    }
  }
  return Status::Ok();
}

Status check_ranks(const MsDeformAttnArg& value, const MsDeformAttnArg& spatial_shapes,
                   const MsDeformAttnArg& level_start_index, const MsDeformAttnArg& sampling_locations,
                   const MsDeformAttnArg& attention_weights, const MsDeformAttnArg* grad_output) {
  if (value.rank >= 0 && value.rank != 4) {
    return Status::InvalidArgument("value must have rank 4 (N, S, M, D), got shape " + shape_str(value));
  }
  if (spatial_shapes.rank >= 0 && (spatial_shapes.rank != 2 || !agree(dim(spatial_shapes, 1), 2))) {
    return Status::InvalidArgument("spatial_shapes must have shape (L, 2), one (H, W) row per level, got shape " +
                                   shape_str(spatial_shapes));
  }
  if (level_start_index.rank >= 0 && level_start_index.rank != 1) {
    return Status::InvalidArgument("level_start_index must have shape (L,), one start per level, got shape " +
                                   shape_str(level_start_index));
  }
  if (sampling_locations.rank >= 0 &&
      (sampling_locations.rank != 6 || !agree(dim(sampling_locations, 5), 2))) {
    return Status::InvalidArgument("sampling_locations must have shape (N, Lq, M, L, P, 2), got shape " +
                                   shape_str(sampling_locations));
  }
  if (attention_weights.rank >= 0 && attention_weights.rank != 5) {
    return Status::InvalidArgument("attention_weights must have shape (N, Lq, M, L, P), got shape " +
                                   shape_str(attention_weights));
  }
  if (grad_output != nullptr && grad_output->rank >= 0 && grad_output->rank != 3) {
    return Status::InvalidArgument("grad_output must have shape (N, Lq, M * D), got shape " + shape_str(*grad_output));
  }
  return Status::Ok();
}

}  // namespace

namespace msda_impl {

// The level checks that need the int64 contents: every H and W > 0, level_start_index the
// running sum of H * W, and the total equal to S (all without overflow). Also run by the
// kernels themselves, so that no call can read outside value.
Status check_levels(const int64_t* spatial_shapes, const int64_t* level_start_index, int64_t L, int64_t S) {
  if (L < 1 || L > kMsDeformAttnMaxLevels) {
    return Status::InvalidArgument("spatial_shapes must have between 1 and " + std::to_string(kMsDeformAttnMaxLevels) +
                                   " rows (one per level), got " + std::to_string(L));
  }
  int64_t total = 0;
  bool overflow = false;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t h = spatial_shapes[2 * l], w = spatial_shapes[2 * l + 1];
    if (h <= 0 || w <= 0) {
      return Status::InvalidArgument("spatial_shapes[" + std::to_string(l) + "] = (" + std::to_string(h) + ", " +
                                     std::to_string(w) + "): H and W must be > 0");
    }
    if (level_start_index != nullptr && !overflow && level_start_index[l] != total) {
      return Status::InvalidArgument("level_start_index[" + std::to_string(l) + "] must be " + std::to_string(total) +
                                     " (the sum of H * W of the levels before it), got " +
                                     std::to_string(level_start_index[l]));
    }
    int64_t hw = 0;
    if (__builtin_mul_overflow(h, w, &hw) || __builtin_add_overflow(total, hw, &total)) overflow = true;
  }
  if (overflow || total != S) {
    return Status::InvalidArgument("the levels' sizes must add up to S = value.shape[1] = " + std::to_string(S) +
                                   ", got sum of H * W over spatial_shapes = " +
                                   (overflow ? std::string("more than 2^63") : std::to_string(total)));
  }
  return Status::Ok();
}

}  // namespace msda_impl

Status ms_deform_attn_check(const MsDeformAttnArg& value, const MsDeformAttnArg& spatial_shapes,
                            const MsDeformAttnArg& level_start_index, const MsDeformAttnArg& sampling_locations,
                            const MsDeformAttnArg& attention_weights, const int64_t* spatial_shapes_data,
                            const int64_t* level_start_index_data, const MsDeformAttnArg* grad_output,
                            MsDeformAttnDims* dims) {
  OPBRIDGE_RETURN_IF_ERROR(
      check_types(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, grad_output));
  OPBRIDGE_RETURN_IF_ERROR(
      check_ranks(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, grad_output));

  const int64_t N = dim(value, 0), S = dim(value, 1), M = dim(value, 2), D = dim(value, 3);
  const int64_t L = dim(spatial_shapes, 0);
  if (L >= 0 && (L < 1 || L > kMsDeformAttnMaxLevels)) {
    return Status::InvalidArgument("spatial_shapes must have between 1 and " + std::to_string(kMsDeformAttnMaxLevels) +
                                   " rows (one per level), got " + std::to_string(L));
  }
  if (!agree(dim(level_start_index, 0), L)) {
    return Status::InvalidArgument("level_start_index must have L = " + std::to_string(L) +
                                   " elements (one per row of spatial_shapes), got shape " +
                                   shape_str(level_start_index));
  }
  const MsDeformAttnArg& loc = sampling_locations;
  if (!agree(dim(loc, 0), N) || !agree(dim(loc, 2), M) || !agree(dim(loc, 3), L)) {
    auto known = [](int64_t v) { return v >= 0 ? std::to_string(v) : std::string("?"); };
    return Status::InvalidArgument("sampling_locations must have shape (N, Lq, M, L, P, 2) with N = value.shape[0] = " +
                                   known(N) + ", M = value.shape[2] = " + known(M) +
                                   " and L = spatial_shapes.shape[0] = " + known(L) + ", got shape " + shape_str(loc));
  }
  // The (N, Lq, M, L, P) every per-sample tensor shares, from whichever argument knows each.
  const int64_t nq[5] = {first_known({dim(loc, 0), N}), dim(loc, 1), first_known({dim(loc, 2), M}),
                         first_known({dim(loc, 3), L}), dim(loc, 4)};
  const MsDeformAttnArg& aw = attention_weights;
  for (int i = 0; i < 5; ++i) {
    if (!agree(dim(aw, i), nq[i])) {
      std::string want = "[";
      for (int k = 0; k < 5; ++k) want += (k ? ", " : "") + (nq[k] >= 0 ? std::to_string(nq[k]) : std::string("?"));
      return Status::InvalidArgument("attention_weights must have shape (N, Lq, M, L, P) = sampling_locations.shape[:5] = " +
                                     want + "], got shape " + shape_str(aw));
    }
  }
  if (grad_output != nullptr) {
    const int64_t n = first_known({nq[0], dim(aw, 0)}), lq = first_known({nq[1], dim(aw, 1)});
    int64_t md = -1;
    const int64_t m = first_known({nq[2], dim(aw, 2)});
    if (m >= 0 && D >= 0 && __builtin_mul_overflow(m, D, &md)) md = -1;
    if (!agree(dim(*grad_output, 0), n) || !agree(dim(*grad_output, 1), lq) || !agree(dim(*grad_output, 2), md)) {
      auto known = [](int64_t v) { return v >= 0 ? std::to_string(v) : std::string("?"); };
      return Status::InvalidArgument("grad_output must have the output's shape (N, Lq, M * D) = [" + known(n) + ", " +
                                     known(lq) + ", " + known(md) + "], got shape " + shape_str(*grad_output));
    }
  }
  if (spatial_shapes_data != nullptr && L >= 0 && S >= 0) {
    OPBRIDGE_RETURN_IF_ERROR(msda_impl::check_levels(spatial_shapes_data, level_start_index_data, L, S));
  }
  if (dims != nullptr) {
    *dims = MsDeformAttnDims{N, S, M, D, nq[1], L, nq[4]};
  }
  return Status::Ok();
}

namespace msda_isa {
template <class T>
void forward_baseline(const FwdArgs<T>& a, const ParallelFor& pf) {
  using S = std::conditional_t<std::is_same_v<T, double>, F64Lanes, SimdGeneric>;
  msda_forward<S, T>(a, pf);
}
template <class T>
void backward_baseline(const BwdArgs<T>& a, const ParallelFor& pf) {
  using S = std::conditional_t<std::is_same_v<T, double>, F64Lanes, SimdGeneric>;
  msda_backward<S, T>(a, pf);
}
}  // namespace msda_isa

namespace {

Status check_isa(CpuIsa isa) {
  if (!cpu_isa_supported(isa)) {
    return Status::NotImplemented(std::string("the ") + cpu_isa_name(isa) +
                                  " kernels are not available on this CPU or in this build");
  }
  return Status::Ok();
}

}  // namespace

template <class T>
Status ms_deform_attn_cpu(const T* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                          const T* sampling_locations, const T* attention_weights, T* output,
                          const MsDeformAttnDims& d, const ParallelFor& pf, CpuIsa isa) {
  OPBRIDGE_RETURN_IF_ERROR(check_isa(isa));
  OPBRIDGE_RETURN_IF_ERROR(msda_impl::check_levels(spatial_shapes, level_start_index, d.L, d.S));
  const msda_isa::FwdArgs<T> a{value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                               output, d};
  switch (cpu_isa_resolve(isa)) {
#if defined(OPBRIDGE_X86_DISPATCH)
    case CpuIsa::kAvx512: msda_isa::forward_avx512(a, pf); break;
    case CpuIsa::kAvx2: msda_isa::forward_avx2(a, pf); break;
#endif
    default: msda_isa::forward_baseline(a, pf); break;
  }
  return Status::Ok();
}

template <class T>
Status ms_deform_attn_backward_cpu(const T* grad_output, const T* value, const int64_t* spatial_shapes,
                                   const int64_t* level_start_index, const T* sampling_locations,
                                   const T* attention_weights, T* grad_value, T* grad_sampling_locations,
                                   T* grad_attention_weights, const MsDeformAttnDims& d, const ParallelFor& pf,
                                   CpuIsa isa) {
  OPBRIDGE_RETURN_IF_ERROR(check_isa(isa));
  OPBRIDGE_RETURN_IF_ERROR(msda_impl::check_levels(spatial_shapes, level_start_index, d.L, d.S));
  const msda_isa::BwdArgs<T> a{grad_output,       value,      spatial_shapes,           level_start_index,
                               sampling_locations, attention_weights, grad_value, grad_sampling_locations,
                               grad_attention_weights, d};
  switch (cpu_isa_resolve(isa)) {
#if defined(OPBRIDGE_X86_DISPATCH)
    case CpuIsa::kAvx512: msda_isa::backward_avx512(a, pf); break;
    case CpuIsa::kAvx2: msda_isa::backward_avx2(a, pf); break;
#endif
    default: msda_isa::backward_baseline(a, pf); break;
  }
  return Status::Ok();
}

#define OPBRIDGE_MSDA_INSTANTIATE(T)                                                                             \
  template Status ms_deform_attn_cpu<T>(const T*, const int64_t*, const int64_t*, const T*, const T*, T*,       \
                                        const MsDeformAttnDims&, const ParallelFor&, CpuIsa);                    \
  template Status ms_deform_attn_backward_cpu<T>(const T*, const T*, const int64_t*, const int64_t*, const T*,  \
                                                 const T*, T*, T*, T*, const MsDeformAttnDims&,                  \
                                                 const ParallelFor&, CpuIsa);
OPBRIDGE_MSDA_INSTANTIATE(float)
OPBRIDGE_MSDA_INSTANTIATE(double)
OPBRIDGE_MSDA_INSTANTIATE(Half)
OPBRIDGE_MSDA_INSTANTIATE(BFloat16)
#undef OPBRIDGE_MSDA_INSTANTIATE

}  // namespace opbridge
