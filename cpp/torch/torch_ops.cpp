// The generic torch kernel (torch_common.h: LibraryOps): one boxed kernel for every compute
// function a library registered (opbridge/kernel.h), on the LibTorch stable ABI.
#include <torch/csrc/stable/accelerator.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

// One op of the library: its declaration, torch name and compute functions.
struct Entry {
  const OpDecl* decl = nullptr;
  std::string qualname;  // "<namespace>::<op>", the prefix of its messages
  ComputeFn cpu = nullptr;
  ComputeFn cuda = nullptr;
  // The input whose memory format outputs keep (keeps_memory_format()), or -1.
  int64_t layout_input = -1;
  // The outputs the compute function sizes ("?" in their rule), one bit each.
  uint64_t sized_by_kernel = 0;
};

// The library's ops by slot; a slot's boxed kernel finds its op here. One table per binary: a
// binary holds one torch library (its own copy of this adapter).
std::array<Entry*, LibraryOps::kMaxOps>& slots() {
  static std::array<Entry*, LibraryOps::kMaxOps> table{};
  return table;
}

// What a call lends its compute function: scratch memory, byte tensors on the call's device from
// torch's caching allocator, released when the call returns (on CUDA, in the order of torch's
// current stream, after the work queued on it: what the allocator expects of a stream-ordered
// user); and the outputs the kernel sizes ("?" in their rule).
class TorchHost final : public KernelHost {
 public:
  TorchHost(TorchCall& c, const Tensor& like) : c_(c), like_(like), sized_(c.call()) {}
  void* scratch(size_t bytes) override {
    // The allocator's blocks are aligned far beyond the 16 bytes promised.
    blocks_.push_back(empty({static_cast<int64_t>(bytes)}, ScalarType::Byte, like_));
    return blocks_.back().data_ptr();
  }
  void* output(size_t i, const std::vector<int64_t>& shape) override {
    const std::string why = sized_.allocate(i, shape);
    if (!why.empty()) c_.check(Status::RuntimeError(why));
    Tensor t = empty(shape, scalar_type(output_type(c_.call(), i)), like_);
    void* data = t.data_ptr();
    c_.set_output(i, std::move(t));
    return data;
  }
  const KernelSizedOutputs& sized() const { return sized_; }

 private:
  TorchCall& c_;
  const Tensor& like_;
  std::vector<Tensor> blocks_;
  KernelSizedOutputs sized_;
};

// One pointer per input or output: on the stack for ops of up to 16 (a heap block per call is
// measurable on tiny tensors).
template <class T>
class Slots {
 public:
  explicit Slots(size_t n) : n_(n) {
    if (n > kInline) heap_.assign(n, nullptr);
  }
  T* data() { return n_ > kInline ? heap_.data() : inline_.data(); }
  T& operator[](size_t i) { return data()[i]; }
  size_t size() const { return n_; }

 private:
  static constexpr size_t kInline = 16;
  std::array<T, kInline> inline_{};
  std::vector<T> heap_;
  size_t n_;
};

void run(const Entry& e, StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  const OpDecl& decl = *e.decl;
  TorchCall c(decl, e.qualname, stack, num_args);
  const Tensor* anchor = c.anchor();
  const bool cuda = anchor != nullptr && anchor->is_cuda();
  const ComputeFn compute = cuda ? e.cuda : e.cpu;
  if (compute == nullptr) {
    throw_error(kNotImplementedTag, e.qualname,
                std::string("has no kernel for ") + (cuda ? "CUDA" : "CPU") + " tensors");
  }
  // Memory format: a channels-last input whose format the outputs keep stays as it is, and the
  // inputs of its rank are brought into that format; every other tensor is made contiguous.
  bool cl = false;
  int64_t cl_rank = -1;
  if (e.layout_input >= 0) {
    const Tensor& like = c.input(static_cast<size_t>(e.layout_input));
    cl = like.defined() && uses_channels_last(like);
    cl_rank = cl ? like.dim() : -1;
  }
  const size_t n_in = decl.inputs().size();
  std::vector<Tensor> kept;  // copies in the layout the kernel reads, alive until it returns
  Slots<const void*> in(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    const ArgDecl& a = *decl.inputs()[i];
    const Tensor& t = c.input(i);
    if (!t.defined()) continue;
    if (a.host_memory) {
      in[i] = c.host(a.name).data_ptr();
    } else if (cl && t.dim() == cl_rank) {
      kept.push_back(in_layout(t, true));
      in[i] = kept.back().data_ptr();
    } else if (t.is_contiguous()) {
      in[i] = t.data_ptr();  // the call holds t
    } else {
      kept.push_back(contiguous(t));
      in[i] = kept.back().data_ptr();
    }
  }
  std::optional<torch::stable::accelerator::DeviceGuard> guard;
  if (cuda) guard.emplace(anchor->get_device_index());
  const Tensor& like_device = anchor != nullptr ? *anchor : c.host(decl.inputs()[0]->name);
  const OpCall& call = c.call();
  Slots<void*> out(decl.outputs().size());
  for (size_t o = 0; o < out.size(); ++o) {
    if ((e.sized_by_kernel >> o) & 1) continue;  // the compute function allocates it (TorchHost::output)
    const OutputDecl& od = decl.outputs()[o];
    const ScalarType type = scalar_type(output_type(call, o));
    Tensor t = cl && od.keeps_memory_format && od.like_input >= 0
                   ? empty_in_layout(c.input(static_cast<size_t>(od.like_input)), true, type)
                   : empty(output_shape(call, o), type, like_device);
    out[o] = t.data_ptr();
    c.set_output(o, std::move(t));
  }
  const ParallelFor pf = torch_parallel();
  TorchHost host(c, like_device);
  KernelCall::Services s;
  s.parallel = &pf;
  s.stream = cuda ? current_cuda_stream(*anchor) : nullptr;
  s.channels_last = cl;
  s.host = &host;
  const KernelCall k(call, cuda ? Device::kCuda : Device::kCpu, in.data(), out.data(), s);
  c.check(compute(k));
  if (e.sized_by_kernel != 0) {
    const std::string missing = host.sized().missing();
    if (!missing.empty()) c.check(Status::RuntimeError(missing));
  }
  c.box_outputs(stack, num_outputs);
}

template <size_t I>
void slot_kernel(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  run(*slots()[I], stack, num_args, num_outputs);
}

template <size_t... I>
constexpr std::array<void (*)(StableIValue*, uint64_t, uint64_t), sizeof...(I)> make_slot_kernels(
    std::index_sequence<I...>) {
  return {&slot_kernel<I>...};
}
constexpr auto kSlotKernels = make_slot_kernels(std::make_index_sequence<LibraryOps::kMaxOps>{});

using Library = torch::stable::detail::StableLibrary;

}  // namespace

struct LibraryOps::State {
  std::string ns;
  const char* library = nullptr;
  // The schemas' library, through the C shim itself: StableLibrary::def throws where torch refuses
  // a schema, which during static initialization (where this runs) ends the process.
  TorchLibraryHandle fragment = nullptr;
  std::unique_ptr<Library> cpu, cuda;
  std::vector<std::unique_ptr<Entry>> entries;
  ~State() {
    cpu.reset();
    cuda.reset();
    if (fragment != nullptr) aoti_torch_delete_library_object(fragment);
  }
};

LibraryOps::LibraryOps(const char* ns, const char* library) : state_(new State) {
  state_->ns = ns;
  state_->library = library;
  if (aoti_torch_library_init_fragment(state_->ns.c_str(), __FILE__, __LINE__, &state_->fragment) !=
      AOTI_TORCH_SUCCESS) {
    state_->fragment = nullptr;
    std::fprintf(stderr, "opbridge: torch refused a library fragment for namespace %s; its ops are not registered\n",
                 ns);
    return;
  }
  on_kernel(&LibraryOps::add, this);
}

LibraryOps::~LibraryOps() {
  // The libraries deregister their ops; the slots' entries go with them.
  delete state_;
}

void LibraryOps::add(const OpKernel& kernel, void* self_ptr) {
  // During static initialization: an exception escaping would end the process. An op that
  // cannot be registered is left out (the library's others still are), said on stderr.
  auto* self = static_cast<LibraryOps*>(self_ptr);
  try {
    add_op(kernel, *self->state_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opbridge: an op of torch namespace %s is not registered: %s\n", self->state_->ns.c_str(),
                 e.what());
  }
}

void LibraryOps::add_op(const OpKernel& kernel, State& st) {
  if (!in_library(kernel, st.library)) return;
  const OpDecl& decl = kernel.decl();
  // A misdeclared op never reaches torch's library-definition call (the declaration refuses every
  // schema torch would): the build's check (opbridge_add_op) and Python's import report it.
  if (!decl.error().empty()) return;
  Entry* e = nullptr;
  size_t index = 0;
  for (; index < st.entries.size(); ++index) {
    if (st.entries[index]->decl == &decl) {
      e = st.entries[index].get();
      break;
    }
  }
  if (e == nullptr) {
    if (st.entries.size() == kMaxOps) {
      throw std::runtime_error("a torch library holds at most " + std::to_string(kMaxOps) + " ops (" + decl.name() +
                               " is one more)");
    }
    auto entry = std::make_unique<Entry>();
    entry->decl = &decl;
    entry->qualname = st.ns + "::" + decl.name();
    const std::string schema = torch_schema(decl);
    if (aoti_torch_library_def(st.fragment, schema.c_str()) != AOTI_TORCH_SUCCESS) {
      // What the declaration cannot know: another library's op of the same name, say.
      throw std::runtime_error("torch refused its schema " + schema + " (is there another op of that name?)");
    }
    for (size_t i = 0; i < decl.outputs().size(); ++i) {
      const OutputDecl& o = decl.outputs()[i];
      if (o.keeps_memory_format && o.like_input >= 0) entry->layout_input = o.like_input;
      if (i < 64 && sized_by_kernel(decl, i)) entry->sized_by_kernel |= uint64_t{1} << i;
    }
    e = entry.get();
    index = st.entries.size();
    slots()[index] = e;
    st.entries.push_back(std::move(entry));
  }
  std::unique_ptr<Library>& lib = kernel.device == Device::kCuda ? st.cuda : st.cpu;
  ComputeFn& fn = kernel.device == Device::kCuda ? e->cuda : e->cpu;
  if (fn != nullptr) {
    throw std::runtime_error(e->qualname + " has two " + device_name(kernel.device) + " kernels");
  }
  fn = kernel.compute;
  if (!lib) {
    lib = std::make_unique<Library>(Library::Kind::IMPL, st.ns.c_str(),
                                    kernel.device == Device::kCuda ? "CUDA" : "CPU", __FILE__, __LINE__);
  }
  lib->impl(decl.name().c_str(), kSlotKernels[index]);
}

}  // namespace opbridge::torch_adapter
