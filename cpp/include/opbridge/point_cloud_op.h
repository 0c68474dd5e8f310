// What the point-cloud ops' declarations and compute functions share (their kernels' math shares
// opbridge/point_cloud.h): the checks of a cloud input and of two inputs' batch sizes, with the
// messages users see, and the element-type dispatch of the ops that gather features by indices.
#pragma once

#include <cstdint>
#include <string>

#include "opbridge/kernel.h"
#include "opbridge/op_decl.h"
#include "opbridge/status.h"

namespace opbridge::point_cloud {

// A cloud input `name` of rank 3 holds 3 coordinates per point; `shape` is how the message
// describes it: "xyz must have shape (B, *, 3), got xyz.shape[2] = 4".
inline Status check_xyz(const TensorArg& t, const char* name, const char* shape = "(B, *, 3)") {
  if (t.known(2) && t.dim(2) != 3) {
    return Status::InvalidArgument(std::string(name) + " must have shape " + shape + ", got " + name +
                                   ".shape[2] = " + std::to_string(t.dim(2)));
  }
  return Status::Ok();
}

// Input `b` has as many batch items as input `a` (what a batch item is: "clouds", "rows"):
// "center_xyz must have B = xyz.shape[0] = 2 clouds, got center_xyz.shape[0] = 3".
inline Status check_same_batch(const TensorArg& a, const char* a_name, const TensorArg& b, const char* b_name,
                               const char* items) {
  if (a.known(0) && b.known(0) && a.dim(0) != b.dim(0)) {
    return Status::InvalidArgument(std::string(b_name) + " must have B = " + a_name + ".shape[0] = " +
                                   std::to_string(a.dim(0)) + " " + items + ", got " + b_name +
                                   ".shape[0] = " + std::to_string(b.dim(0)));
  }
  return Status::Ok();
}

// Inputs `a` and `b` of `call` are clouds of as many batch items: the ops that search one cloud for
// the points of another check their two clouds with this.
inline Status check_cloud_pair(const OpCall& call, const char* a, const char* b) {
  const TensorArg &ta = call.in(a), &tb = call.in(b);
  OPBRIDGE_RETURN_IF_ERROR(check_xyz(ta, a));
  OPBRIDGE_RETURN_IF_ERROR(check_xyz(tb, b));
  return check_same_batch(ta, a, tb, b, "clouds");
}

// fn(I{}, T{}) for the element types of the inputs "indices" (int64, int32) and "features" (the
// float types): the dispatch of every op that gathers features by indices, on CPU and CUDA.
template <class F>
Status dispatch_gather(const KernelCall& k, F&& fn) {
  return dispatch<int64_t, int32_t>(k.type("indices"), [&](auto itag) {
    return dispatch<float, double, Half, BFloat16>(k.type("features"), [&](auto tag) -> Status { return fn(itag, tag); });
  });
}

}  // namespace opbridge::point_cloud
