// String attributes for the ORT CUDA ops (GroupNorm's activation, Inverse's on_singular), with
// the conventions of ort_op.h's readers: absent -> the default, present with another type -> an
// ORT_INVALID_ARGUMENT error naming the attribute. Used where ort_op.h has no string reader.
#pragma once

#include <string>

#include "ort_op.h"

namespace opbridge::ort {

inline std::string cuda_attr_string(const OrtKernelInfo* info, const char* name, const std::string& fallback) {
  const auto ok = [](OrtStatus* st) {
    if (st == nullptr) return true;
    api().ReleaseStatus(st);
    return false;
  };
  size_t size = 0;
  if (!ok(api().KernelInfoGetAttribute_string(info, name, nullptr, &size))) {
    // ORT reports "missing" and "wrong type" alike: probe the other scalar getters.
    int64_t i = 0;
    float f = 0.f;
    if (ok(api().KernelInfoGetAttribute_int64(info, name, &i))) {
      fail(ORT_INVALID_ARGUMENT, std::string("attribute '") + name + "' must be a string, got an int");
    }
    if (ok(api().KernelInfoGetAttribute_float(info, name, &f))) {
      fail(ORT_INVALID_ARGUMENT, std::string("attribute '") + name + "' must be a string, got a float");
    }
    return fallback;
  }
  std::string value(size, '\0');
  check(api().KernelInfoGetAttribute_string(info, name, value.data(), &size));
  value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  return value;
}

}  // namespace opbridge::ort
