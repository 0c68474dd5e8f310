// Argument parsing and validation used by the CUDA adapters (torch and ORT) of the ops'
// version-2 arguments: GroupNorm's activation, Inverse's on_singular and the shapes and level
// table of MultiScaleDeformableAttention. Framework-free, like the CPU ops' checks in
// cpp/include/opbridge/<op>.h, whose messages they follow. When those headers provide the same
// checks, the adapters call them instead and this file goes away.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "opbridge/group_norm.h"
#include "opbridge/ms_deform_attn.h"
#include "opbridge/status.h"

namespace opbridge::cuda_checks {

// "none" | "silu" -> Activation.
inline Status parse_activation(std::string_view s, Activation* out) {
  if (s == "none") {
    *out = Activation::kNone;
  } else if (s == "silu") {
    *out = Activation::kSilu;
  } else {
    return Status::InvalidArgument("activation must be \"none\" or \"silu\", got \"" + std::string(s) + "\"");
  }
  return Status::Ok();
}

// "raise" | "nan" -> whether a singular matrix gives NaN instead of an error.
inline Status parse_on_singular(std::string_view s, bool* nan_on_singular) {
  if (s == "raise") {
    *nan_on_singular = false;
  } else if (s == "nan") {
    *nan_on_singular = true;
  } else {
    return Status::InvalidArgument("on_singular must be \"raise\" or \"nan\", got \"" + std::string(s) + "\"");
  }
  return Status::Ok();
}

// Largest height or width of a level: pixel coordinates x * W - 0.5 stay exact in float32 and
// every tap index fits the kernels' 32-bit coordinates.
inline constexpr int64_t kMsDeformAttnMaxSide = int64_t{1} << 24;

namespace detail {
inline std::string shape_str(const int64_t* shape, int64_t rank) {
  std::string s = "[";
  for (int64_t i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace detail

// Validates the shapes of MultiScaleDeformableAttention's inputs (given as (pointer, rank)) and
// returns its sizes in *d. The values of the level table are checked by
// ms_deform_attn_check_levels, once these shapes are known to be valid.
inline Status ms_deform_attn_check_shapes(const int64_t* value_shape, int64_t value_rank,
                                          const int64_t* shapes_shape, int64_t shapes_rank,
                                          const int64_t* start_shape, int64_t start_rank, const int64_t* loc_shape,
                                          int64_t loc_rank, const int64_t* attn_shape, int64_t attn_rank,
                                          MsDeformAttnDims* d) {
  using detail::shape_str;
  if (value_rank != 4) {
    return Status::InvalidArgument("value must have rank 4 (N, S, M, D), got shape " +
                                   shape_str(value_shape, value_rank));
  }
  if (shapes_rank != 2 || shapes_shape[1] != 2) {
    return Status::InvalidArgument("spatial_shapes must have shape (L, 2) (one (H, W) row per level), got " +
                                   shape_str(shapes_shape, shapes_rank));
  }
  const int64_t L = shapes_shape[0];
  if (L < 1 || L > kMsDeformAttnMaxLevels) {
    return Status::InvalidArgument("spatial_shapes must have between 1 and " +
                                   std::to_string(kMsDeformAttnMaxLevels) + " levels (rows), got " +
                                   std::to_string(L));
  }
  if (start_rank != 1 || start_shape[0] != L) {
    return Status::InvalidArgument("level_start_index must have shape (L,) = (" + std::to_string(L) +
                                   ",) like spatial_shapes, got " + shape_str(start_shape, start_rank));
  }
  const int64_t N = value_shape[0], M = value_shape[2], D = value_shape[3];
  if (loc_rank != 6 || loc_shape[0] != N || loc_shape[2] != M || loc_shape[3] != L || loc_shape[5] != 2) {
    return Status::InvalidArgument("sampling_locations must have shape (N, Lq, M, L, P, 2) = (" +
                                   std::to_string(N) + ", Lq, " + std::to_string(M) + ", " + std::to_string(L) +
                                   ", P, 2), got " + shape_str(loc_shape, loc_rank));
  }
  const int64_t Lq = loc_shape[1], P = loc_shape[4];
  if (attn_rank != 5 || attn_shape[0] != N || attn_shape[1] != Lq || attn_shape[2] != M || attn_shape[3] != L ||
      attn_shape[4] != P) {
    return Status::InvalidArgument("attention_weights must have shape (N, Lq, M, L, P) = " +
                                   shape_str(loc_shape, 5) + ", got " + shape_str(attn_shape, attn_rank));
  }
  *d = MsDeformAttnDims{N, value_shape[1], M, D, Lq, L, P};
  return Status::Ok();
}

// Validates the level table: spatial_shapes [d.L, 2] and level_start_index [d.L] host int64
// arrays (d from ms_deform_attn_check_shapes).
inline Status ms_deform_attn_check_levels(const MsDeformAttnDims& d, const int64_t* spatial_shapes,
                                          const int64_t* level_start_index) {
  int64_t total = 0;
  for (int64_t l = 0; l < d.L; ++l) {
    const int64_t h = spatial_shapes[2 * l], w = spatial_shapes[2 * l + 1];
    if (h < 1 || w < 1 || h > kMsDeformAttnMaxSide || w > kMsDeformAttnMaxSide) {
      return Status::InvalidArgument("spatial_shapes[" + std::to_string(l) + "] = (" + std::to_string(h) + ", " +
                                     std::to_string(w) + "): height and width must be between 1 and " +
                                     std::to_string(kMsDeformAttnMaxSide));
    }
    if (level_start_index[l] != total) {
      return Status::InvalidArgument("level_start_index[" + std::to_string(l) + "] must be " +
                                     std::to_string(total) + " (the sum of H * W of the levels before it), got " +
                                     std::to_string(level_start_index[l]));
    }
    total += h * w;  // < 16 * 2^48: no overflow
  }
  if (total != d.S) {
    return Status::InvalidArgument("value.shape[1] must be S = sum of H * W over spatial_shapes = " +
                                   std::to_string(total) + ", got " + std::to_string(d.S));
  }
  return Status::Ok();
}

}  // namespace opbridge::cuda_checks
