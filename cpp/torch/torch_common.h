// opbridge torch adapter on the LibTorch stable ABI (torch/csrc/stable, torch/headeronly and the
// C shim): one binary loads into every torch from the release it targets (TORCH_TARGET_VERSION,
// 2.11) on. Nothing here includes ATen or c10 headers or uses a libtorch C++ symbol: a kernel is a
// boxed function (StableIValue stack) registered with STABLE_TORCH_LIBRARY_IMPL, tensors are
// torch::stable::Tensor, every torch call goes through the C shim.
//
// A declared op needs no torch code of its own: one generic boxed kernel (LibraryOps, below)
// serves every compute function a library registered (opbridge/kernel.h): it reads the arguments
// the declaration lists, runs its checks, brings the inputs into the layout the compute function
// takes, allocates the outputs the declaration's rules give, queues CUDA work on torch's current
// stream, and translates the status.
//
// Errors: the stable ABI raises every C++ exception in Python as RuntimeError. opbridge tags the
// message with the exception type it stands for ("ValueError: opbridge::group_norm: x must ...",
// see the k*Tag constants below); opbridge.ops translates it back (opbridge/ops/_errors.py), so the Python API
// raises ValueError, TypeError, NotImplementedError and torch.linalg.LinAlgError.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "opbridge/kernel.h"
#include "opbridge/op_decl.h"
#include "opbridge/parallel.h"
#include "opbridge/status.h"

// Hidden, like torch's stable types it holds: each library embeds its own copy of the adapter.
namespace opbridge {
namespace torch_adapter __attribute__((visibility("hidden"))) {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;

// ---- errors ------------------------------------------------------------------------------------
// The tags of messages, by the Python exception they stand for. The message of a tagged error is
// "<tag>: <qualname>: <what>"; an error without a tag is a plain RuntimeError.
inline constexpr const char* kValueErrorTag = "ValueError";
inline constexpr const char* kTypeErrorTag = "TypeError";
inline constexpr const char* kNotImplementedTag = "NotImplementedError";
inline constexpr const char* kLinAlgErrorTag = "LinAlgError";

// Throws std::runtime_error("<tag>: <qualname>: <message>") (tag may be nullptr: no tag).
[[noreturn]] void throw_error(const char* tag, std::string_view qualname, std::string_view message);
// Throws the error matching a non-ok Status (kInvalidArgument: ValueError, kTypeError: TypeError,
// kNotImplemented: NotImplementedError, others: RuntimeError), prefixed with the op's name.
void check_status(const Status& status, std::string_view qualname);
inline void check_value(bool cond, std::string_view qualname, const std::string& message) {
  if (!cond) throw_error(kValueErrorTag, qualname, message);
}

// ---- tensors -----------------------------------------------------------------------------------
// t's dtype, as t.scalar_type() but with one shim call for the floating and int64 types (the
// stable ABI's conversion asks the shim for each candidate in turn).
ScalarType dtype(const Tensor& t);
// The ONNX element type of a torch dtype (kUndefined for others), and back.
ElemType elem_type(ScalarType t);
ScalarType scalar_type(ElemType t);
std::vector<int64_t> sizes(const Tensor& t);
// "cpu", "cuda:0".
std::string device_string(const Tensor& t);
bool same_device(const Tensor& a, const Tensor& b);

// A new uninitialized tensor of `like`'s device, with the given sizes and strides (empty: contiguous).
Tensor empty_strided(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, ScalarType dtype,
                     const Tensor& like);
inline Tensor empty(const std::vector<int64_t>& sizes, ScalarType dtype, const Tensor& like) {
  return empty_strided(sizes, {}, dtype, like);
}
// t itself when contiguous, else a contiguous copy.
Tensor contiguous(const Tensor& t);
// t on the CPU (a copy only where it is elsewhere).
Tensor to_cpu(const Tensor& t);

// ---- memory formats (ops whose outputs keeps_memory_format(); the fake kernels follow the same
// rule, opbridge/ops/_torch_adapter.py: channels_last) ----
// (0, 2, ..., rank - 1, 1): x.permute(this) is [N, *spatial, C].
std::vector<int64_t> channels_last_order(int64_t rank);
// Whether x is processed as [N, S, C]: its memory is channels-last and it is not also
// contiguous (where both hold, e.g. C = 1 or all spatial dims 1, the two views coincide); a
// single sample (N = 1) only with a batch stride of at least its size, as torch decides.
bool uses_channels_last(const Tensor& x);
// A new tensor of x's sizes, channels-last (strides of a contiguous [N, *spatial, C] buffer) or
// contiguous, of x's dtype or `dtype`.
Tensor empty_in_layout(const Tensor& x, bool channels_last);
Tensor empty_in_layout(const Tensor& x, bool channels_last, ScalarType dtype);
// t in the given layout (a copy only where t's memory differs).
Tensor in_layout(const Tensor& t, bool channels_last);

// An undefined tensor (what an absent optional input reads as).
const Tensor& undefined_tensor();

// torch's parallel_for (torch_parallel_for of the C shim), so kernels follow torch.set_num_threads.
ParallelFor torch_parallel();

// torch's current CUDA stream (a cudaStream_t) on t's device: the C shim's
// aoti_torch_get_current_cuda_stream, found at run time in the libtorch_cuda torch has loaded (a
// CPU torch has none: then this throws, and no CUDA tensor can reach a CUDA kernel there anyway).
// The library thus needs no CUDA torch to build and loads into CPU and CUDA torch alike.
void* current_cuda_stream(const Tensor& t);

// ---- boxed stacks ------------------------------------------------------------------------------
// Reading a boxed kernel's arguments (each taken over, once) and writing its results.
class BoxedArgs {
 public:
  BoxedArgs(StableIValue* stack, uint64_t num_args) : stack_(stack), n_(num_args) {}
  uint64_t size() const { return n_; }
  Tensor tensor(uint64_t i) const;
  std::optional<Tensor> optional_tensor(uint64_t i) const;
  int64_t int64(uint64_t i) const;
  double float64(uint64_t i) const;
  bool boolean(uint64_t i) const;
  std::string string(uint64_t i) const;
  std::vector<int64_t> int64_list(uint64_t i) const;
  std::vector<double> float64_list(uint64_t i) const;
  static void set(StableIValue* stack, uint64_t i, const Tensor& t);

 private:
  StableIValue* stack_;
  uint64_t n_;
};

// ---- declared ops (opbridge/op_decl.h) ---------------------------------------------------------
// The torch schema of a declaration, e.g. "group_norm(Tensor x, int num_groups, Tensor? weight=None, ...) -> Tensor"
// (of a declaration without error(): the declaration refuses what torch's schema parser would).
std::string torch_schema(const OpDecl& decl);

// One call of a declared op, unboxed from torch's stack and checked by the declaration: the
// tensors by name, the OpCall the checks passed (attributes with their values), host copies of
// host_memory inputs, and the outputs the generic kernel sets.
class TorchCall {
 public:
  // Reads the arguments (schema order), checks devices (tensor inputs other than host_memory
  // ones on the first input's device) and runs check_call; throws the tagged error on failure.
  // qualname must outlive the call (a literal or a static string).
  TorchCall(const OpDecl& decl, std::string_view qualname, StableIValue* stack, uint64_t num_args);

  const OpDecl& decl() const { return *decl_; }
  std::string_view qualname() const { return qualname_; }
  const OpCall& call() const { return call_; }
  // The tensor input of that index among the declaration's inputs (undefined for an absent
  // optional input).
  const Tensor& input(size_t i) const;
  // A host_memory input: contiguous on the CPU (copied once from a device tensor).
  const Tensor& host(std::string_view name) const;
  // The input whose device the call runs on: the first present input that is not host_memory,
  // forward arguments before gradients (nullptr when every input is host_memory).
  const Tensor* anchor() const { return anchor_; }
  void set_output(size_t i, Tensor t);
  // Throws the tagged error for a non-ok status (e.g. the kernel's), as check_status does.
  void check(const Status& status) const { check_status(status, qualname_); }

  // Writes the outputs to the stack (the boxed kernel's last step).
  void box_outputs(StableIValue* stack, uint64_t num_outputs) const;

 private:
  const OpDecl* decl_;
  std::string_view qualname_;
  OpCall call_;
  std::vector<std::optional<Tensor>> inputs_;  // per declared input (empty: absent)
  std::vector<std::optional<Tensor>> host_;    // per declared input (set for host_memory ones)
  std::vector<std::optional<Tensor>> outputs_;
  const Tensor* anchor_ = nullptr;
};

// ---- the generic kernel ----------------------------------------------------------------------
// The torch ops of one library: for every compute function registered for `library` (nullptr:
// any) in this binary, the op's schema from its declaration in torch namespace `ns`, and the
// generic boxed kernel for the CPU or CUDA dispatch key. Define exactly one per torch library,
// at namespace scope (OPBRIDGE_TORCH_LIBRARY); it registers during static initialization, and
// also the compute functions whose own registration runs after it.
class LibraryOps {
 public:
  LibraryOps(const char* ns, const char* library);
  ~LibraryOps();
  LibraryOps(const LibraryOps&) = delete;
  LibraryOps& operator=(const LibraryOps&) = delete;

  // Ops of one library with a generic kernel (their boxed kernels are slots of a fixed table,
  // since torch's boxed kernels carry no context).
  static constexpr size_t kMaxOps = 64;

 private:
  struct State;
  static void add(const OpKernel& kernel, void* self);
  static void add_op(const OpKernel& kernel, State& state);
  State* state_;
};
#define OPBRIDGE_TORCH_LIBRARY(ns, library) \
  static ::opbridge::torch_adapter::LibraryOps opbridge_torch_library_ops_((ns), (library))

}  // namespace torch_adapter
}  // namespace opbridge
