// opbridge: an op's compute functions, as every framework calls them.
//
// An op is its declaration (opbridge/op_decl.h), one function from a checked call to its kernel's
// arguments, and one compute function per device:
//
//   Status group_norm_cpu(const KernelCall& k) {            // ops/group_norm/group_norm_cpu.cpp
//     const GroupNormParams p = group_norm_params(k);         // from the declaration's file
//     return dispatch<float, double, Half, BFloat16>(k.type("x"), [&](auto tag) {
//       using T = decltype(tag);
//       return group_norm_cpu<T>(k.in<T>("x"), k.in<T>("weight"), k.in<T>("bias"), k.out<T>(0), p, ...);
//     });
//   }
//   OPBRIDGE_KERNEL(group_norm_decl, kCpu, group_norm_cpu);
//
// One generic adapter per framework serves every registered compute function, ours and users':
// the torch kernel (cpp/torch/torch_ops.cpp), the ORT kernel for the CPU and CUDA execution
// providers (cpp/ort/declared_kernel.cpp) and opbridge._core (OpbridgeRunHost of opbridge's C ABI,
// opbridge/c_abi.h, which every library exports). Each reads the arguments the declaration lists, runs its checks (check_call), gets
// the inputs into the layout the compute function expects (contiguous; see channels_last()),
// allocates the outputs with the shapes and types the declaration's rules give, and translates
// the returned Status. A compute function therefore only turns the checked call into its
// kernel's arguments and runs the kernel.
//
// Framework-free: no torch, no ORT, no Python, no CUDA runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "opbridge/cpu_isa.h"
#include "opbridge/op_decl.h"
#include "opbridge/parallel.h"
#include "opbridge/status.h"

namespace opbridge {

enum class Device : int32_t { kCpu = 0, kCuda = 1 };
const char* device_name(Device d);  // "cpu", "cuda"

// What the framework lends a compute function for one call, beyond the tensors.
class KernelHost {
 public:
  virtual ~KernelHost() = default;
  // `bytes` of scratch memory on the call's device, 16-byte aligned (nullptr for 0 bytes). It
  // stays the compute function's until it returns; on CUDA it is released in stream order, so the
  // work queued on stream() may use it. Throws when the framework cannot allocate it.
  virtual void* scratch(size_t bytes) = 0;
  // Allocates output `i`, one whose rule has a "?" dimension (its size depends on the input
  // values), with `shape` on the call's device; returns its data. Throws for another output, a
  // shape of another rank or other known sizes than the rule gives, or a second allocation.
  virtual void* output(size_t i, const std::vector<int64_t>& shape) = 0;
};

// For an adapter's KernelHost: the outputs a compute function sizes itself ("?" in their rule),
// checked as it allocates them and when it returns. The messages name the output and its rule.
class KernelSizedOutputs {
 public:
  explicit KernelSizedOutputs(const OpCall& call) : call_(call) {}
  // Empty, and output `i` counted as allocated, where the kernel may allocate it with `shape`
  // (check_kernel_shape; not twice); else why not.
  std::string allocate(size_t i, const std::vector<int64_t>& shape);
  // Empty where the kernel allocated every output it sizes; else the first it left out.
  std::string missing() const;

 private:
  const OpCall& call_;
  uint64_t allocated_ = 0;  // one bit per output (a declaration has at most 64)
};

// One call of a declared op on one device, as its compute function sees it.
class KernelCall {
 public:
  struct Services {
    const ParallelFor* parallel = nullptr;  // CPU: the framework's thread pool (nullptr: serial)
    CpuIsa isa = CpuIsa::kAuto;             // CPU: the instruction-set variant (kAuto but in tests)
    void* stream = nullptr;                 // CUDA: the cudaStream_t to queue the work on
    bool channels_last = false;             // see channels_last()
    KernelHost* host = nullptr;             // scratch memory, the outputs the kernel sizes
  };

  // inputs: per declared input, its data (nullptr for an absent optional input);
  // outputs: per declared output, its data, allocated with output_shape(call, i).
  KernelCall(const OpCall& call, Device device, const void* const* inputs, void* const* outputs,
             const Services& services)
      : call_(call), device_(device), inputs_(inputs), outputs_(outputs), s_(services) {}

  // The call that passed the declaration's checks: element types, shapes, attribute values.
  const OpCall& call() const { return call_; }
  const OpDecl& decl() const { return call_.decl(); }
  Device device() const { return device_; }

  // The element type and shape of input `name` (its torch name in the declaration).
  ElemType type(std::string_view name) const { return call_.in(name).type; }
  const TensorArg& arg(std::string_view name) const { return call_.in(name); }
  // The data of input `name`: nullptr for an absent optional input. On the call's device, except
  // for inputs declared host_memory(), which are always host memory.
  template <class T>
  const T* in(std::string_view name) const {
    return static_cast<const T*>(input_data(static_cast<size_t>(index_of(name))));
  }
  const void* input_data(size_t i) const { return inputs_[i]; }
  // Output `i`, allocated with the shape the declaration's rule gives (output_shape(call(), i));
  // nullptr for an output whose rule has a "?" dimension: the compute function sizes that one.
  template <class T>
  T* out(size_t i) const {
    return static_cast<T*>(outputs_[i]);
  }
  // Allocates output `i`, whose rule has a "?" dimension, once the compute function knows its
  // shape (all of it: the rule's other dimensions too); on the call's device. Every such output
  // must be allocated before the compute function returns Ok.
  template <class T>
  T* out(size_t i, const std::vector<int64_t>& shape) const {
    return static_cast<T*>(s_.host->output(i, shape));
  }

  // Whether the inputs and outputs whose memory format the declaration keeps
  // (keeps_memory_format(): the output, the input it is "like" and the inputs of that input's
  // rank) are channels-last, [N, *spatial, C] in memory (torch's channels_last tensors, and
  // _core's channels_last=True); otherwise every tensor is contiguous in its logical shape.
  bool channels_last() const { return s_.channels_last; }
  // CPU: the framework's parallel-for (serial where it has none).
  const ParallelFor& parallel() const { return s_.parallel != nullptr ? *s_.parallel : serial_; }
  CpuIsa isa() const { return s_.isa; }
  // CUDA: the stream to queue the work on (a cudaStream_t).
  void* stream() const { return s_.stream; }
  // Scratch memory on the call's device (see KernelHost::scratch).
  void* scratch(size_t bytes) const { return bytes == 0 ? nullptr : s_.host->scratch(bytes); }

 private:
  int64_t index_of(std::string_view name) const;
  const OpCall& call_;
  Device device_;
  const void* const* inputs_;
  void* const* outputs_;
  Services s_;
  ParallelFor serial_;
};

// A compute function: runs the op's kernel for one checked call; returns its status (never throws,
// except where KernelCall::scratch does). The statuses' codes reach Python as the exception they
// name (kInvalidArgument: ValueError, kTypeError: TypeError, kNotImplemented: NotImplementedError,
// kLinAlgError: torch.linalg.LinAlgError in torch, RuntimeError elsewhere).
using ComputeFn = Status (*)(const KernelCall& k);

// One registered compute function.
struct OpKernel {
  const OpDecl& (*decl)();
  Device device;
  ComputeFn compute;
  // The library (opbridge_add_op's LIBRARY) the compute function was built into: each library's
  // adapters serve its own ops only.
  const char* library;
};

// Registers a compute function (OPBRIDGE_KERNEL, during static initialization).
void register_kernel(const OpKernel& kernel);
// Every compute function registered so far in this binary, in registration order.
const std::vector<OpKernel>& registered_kernels();
// Calls fn(kernel, ctx) for every compute function registered so far and then for each one
// registered later: adapters that register with their framework during static initialization
// (the torch library) see every kernel, whichever static initializer runs first.
void on_kernel(void (*fn)(const OpKernel& kernel, void* ctx), void* ctx);
// Whether a registered kernel belongs to `library` (nullptr: any library).
bool in_library(const OpKernel& kernel, const char* library);

struct KernelRegistrar {
  explicit KernelRegistrar(const OpKernel& kernel) { register_kernel(kernel); }
};

}  // namespace opbridge

// The library name opbridge_add_op() compiles a library's kernels with.
#ifndef OPBRIDGE_LIBRARY_NAME
#define OPBRIDGE_LIBRARY_NAME ""
#endif
#define OPBRIDGE_KERNEL_CONCAT_(a, b) a##b
#define OPBRIDGE_KERNEL_CONCAT(a, b) OPBRIDGE_KERNEL_CONCAT_(a, b)
// OPBRIDGE_KERNEL(decl, device, compute): registers `compute` (Status(const KernelCall&)) as the
// kernel of the declared op `decl()` on `device` (kCpu or kCuda), for its library's adapters.
#define OPBRIDGE_KERNEL(decl, device, compute)                                                     \
  static const ::opbridge::KernelRegistrar OPBRIDGE_KERNEL_CONCAT(opbridge_kernel_, __LINE__)( \
      ::opbridge::OpKernel{&decl, ::opbridge::Device::device, &compute, OPBRIDGE_LIBRARY_NAME})
