// What the point-cloud ops' declarations and compute functions share (their kernels' math shares
// opbridge/point_cloud.h): the start of their declarations, the checks of a cloud input, of two
// inputs' batch sizes and of gather indices, with the messages users see, the sizes of two
// clouds, and the element-type dispatch of the ops that gather features by indices.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "opbridge/kernel.h"
#include "opbridge/op_decl.h"
#include "opbridge/status.h"

namespace opbridge::point_cloud {

// The start of every point-cloud op's declaration (ONNX version 3): coordinates and features T
// of the float types, indices I of `index_types`.
inline OpDecl op_decl(const char* name, const char* op_type, const char* doc,
                      std::vector<ElemType> index_types = {ElemType::kInt64}) {
  OpDecl d(name, op_type, 3);
  d.doc(doc).types("T", kFloatTypes).types("I", std::move(index_types));
  return d;
}

// Input `name` of `decl`: a cloud of points of type T, described as `shape` ("(B, N, 3)").
inline OpDecl cloud_input(OpDecl decl, const char* name, const char* doc, const char* shape) {
  decl.input(name, "T", doc).shape(shape).rank(3);
  return decl;
}

// The two clouds of the ops that search one for the points of the other: `a` [B, N, 3], then
// `b` [B, M, 3] (their checks: check_cloud_pair).
inline OpDecl cloud_pair_inputs(OpDecl decl, const char* a, const char* a_doc, const char* b, const char* b_doc) {
  return cloud_input(cloud_input(std::move(decl), a, a_doc, "(B, N, 3)"), b, b_doc, "(B, M, 3)");
}

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

// The gradient of `forward` (version 3), named after it (gather_points_backward,
// GatherPointsBackward): grad_output (shaped like forward's output, described as `grad_shape`),
// then forward's arguments; its first output is grad_features. The caller adds any further
// output and gradient_of(forward, ...).
inline OpDecl backward_decl(const OpDecl& forward, const std::string& doc, const char* grad_shape) {
  OpDecl d(forward.name() + "_backward", forward.onnx_type() + "Backward", 3);
  d.doc(doc).input("grad_output", "T", "gradient of the output").shape(grad_shape).args_of(forward);
  d.output("grad_features", "T", "features", "shape of features");
  return d;
}

// B, N, M of the ops over clouds a [B, N, 3] and b [B, M, 3].
struct CloudDims {
  int64_t B = 0, N = 0, M = 0;
};
inline CloudDims cloud_dims(const KernelCall& k, const char* a, const char* b) {
  return {k.arg(a).dim(0), k.arg(a).dim(1), k.arg(b).dim(1)};
}

// The first index outside [0, n) of `indices` (of shape `shape`), as an InvalidArgument naming it
// by position and what it indexes, `n_name` the size's letter: "indices[0, 2] = 7 is outside
// [0, N = features.shape[2] = 5)"; Ok when every index is in range. The CPU kernels of the ops
// that gather features by indices check with this before they read.
template <class I>
Status check_indices(const I* indices, const std::vector<int64_t>& shape, int64_t n, const char* n_name) {
  int64_t total = 1;
  for (int64_t s : shape) total *= s;
  for (int64_t j = 0; j < total; ++j) {
    const int64_t v = static_cast<int64_t>(indices[j]);
    if (v >= 0 && v < n) continue;
    std::string where;
    int64_t rest = j;
    for (size_t a = shape.size(); a-- > 0;) {
      where = std::to_string(rest % shape[a]) + (where.empty() ? "" : ", ") + where;
      rest /= shape[a];
    }
    return Status::InvalidArgument("indices[" + where + "] = " + std::to_string(v) + " is outside [0, " + n_name +
                                   " = features.shape[2] = " + std::to_string(n) + ")");
  }
  return Status::Ok();
}

// fn(T{}, indices) for the element type T of the input "features" (the float types), `indices`
// the input "indices" as a pointer of its type (int64, int32): the dispatch of every op that
// gathers features by indices, on CPU and CUDA.
template <class F>
Status dispatch_gather(const KernelCall& k, F&& fn) {
  return dispatch<int64_t, int32_t>(k.type("indices"), [&](auto itag) {
    const auto* indices = k.in<decltype(itag)>("indices");
    return dispatch<float, double, Half, BFloat16>(k.type("features"), [&](auto tag) -> Status { return fn(tag, indices); });
  });
}

// X(T, I) for each element type T and index type I of the ops that gather features by indices
// (dispatch_gather's): their kernels' explicit instantiations.
#define OPBRIDGE_FOR_GATHER_TYPES(X)                                                      \
  X(float, int64_t) X(double, int64_t) X(::opbridge::Half, int64_t) X(::opbridge::BFloat16, int64_t) \
  X(float, int32_t) X(double, int32_t) X(::opbridge::Half, int32_t) X(::opbridge::BFloat16, int32_t)

// dispatch_gather for the CPU kernels, which first check every index against n (n_name: its
// letter in the message), then run fn(T{}, indices).
template <class F>
Status dispatch_checked_gather(const KernelCall& k, int64_t n, const char* n_name, F&& fn) {
  return dispatch_gather(k, [&](auto tag, const auto* indices) {
    OPBRIDGE_RETURN_IF_ERROR(check_indices(indices, k.arg("indices").shape, n, n_name));
    fn(tag, indices);
    return Status::Ok();
  });
}

}  // namespace opbridge::point_cloud
