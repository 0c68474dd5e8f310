// The core library: opbridge's C ABI (opbridge/c_abi.h) over a binary's registered compute
// functions and their declarations. Framework-free, so the ORT library, the torch library and
// opbridge._core each serve it from what they link, and none needs another's binary.
#include "opbridge/c_abi.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "opbridge/kernel.h"
#include "opbridge/op_decl.h"

namespace opbridge::c_abi {
namespace {

// The declared ops of `library`, once each, in the order their compute functions registered.
std::vector<const OpDecl*> declared_ops(const char* library) {
  std::vector<const OpDecl*> ops;
  for (const OpKernel& k : registered_kernels()) {
    if (!in_library(k, library)) continue;
    const OpDecl& d = k.decl();
    bool seen = false;
    for (const OpDecl* o : ops) seen = seen || o == &d || o->name() == d.name();
    if (!seen) ops.push_back(&d);
  }
  return ops;
}

const OpDecl* find_declared(const char* name, const char* library) {
  for (const OpDecl* d : declared_ops(library)) {
    if (d->name() == name) return d;
  }
  return nullptr;
}

// Writes a status to the entry points' message buffer; returns its code.
int32_t reply(char* message, int64_t size, StatusCode code, const std::string& text) {
  if (message != nullptr && size > 0) {
    const size_t len = std::min<size_t>(text.size(), static_cast<size_t>(size - 1));
    std::memcpy(message, text.data(), len);
    message[len] = '\0';
  }
  return static_cast<int32_t>(code);
}

// The call the entry points describe, in `call` (of its op's declaration); an error status when
// the counts do not match the declaration's.
Status fill_call(OpCall& call, const char* entry, const OpbridgeTensor* inputs, int64_t n_inputs,
                 const OpbridgeAttr* attrs, int64_t n_attrs) {
  if (n_inputs != static_cast<int64_t>(call.input_count()) || n_attrs != static_cast<int64_t>(call.attr_count())) {
    return Status::InvalidArgument(std::string(entry) + ": op " + call.decl().name() + " has " +
                                   std::to_string(call.input_count()) + " inputs and " +
                                   std::to_string(call.attr_count()) + " attributes");
  }
  for (int64_t i = 0; i < n_inputs; ++i) {
    TensorArg& t = call.input(static_cast<size_t>(i));
    t.present = inputs[i].present != 0;
    t.type = static_cast<ElemType>(inputs[i].type);
    t.rank_known = inputs[i].rank >= 0;
    if (t.rank_known) t.shape.assign(inputs[i].dims, inputs[i].dims + inputs[i].rank);
    t.data = inputs[i].data;
  }
  for (int64_t i = 0; i < n_attrs; ++i) {
    if (attrs[i].present == 0) continue;
    AttrValue& v = call.attr(static_cast<size_t>(i));
    v.i = attrs[i].i;
    v.f = float_attribute(attrs[i].f);  // ONNX's float32, as everywhere
    v.s = attrs[i].s != nullptr ? attrs[i].s : "";
    if (attrs[i].ints != nullptr) v.ints.assign(attrs[i].ints, attrs[i].ints + attrs[i].n);
    if (attrs[i].floats != nullptr) v.floats.assign(attrs[i].floats, attrs[i].floats + attrs[i].n);
    for (double& f : v.floats) f = float_attribute(f);
  }
  return Status::Ok();
}

// What a host run lends its compute function: scratch memory, plain heap blocks freed when the
// run returns; and the outputs the kernel sizes, from the caller's allocator.
class HostRun final : public KernelHost {
 public:
  HostRun(const OpCall& call, OpbridgeAlloc alloc, void* ctx) : call_(call), alloc_(alloc), ctx_(ctx), sized_(call) {}
  void* scratch(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    blocks_.emplace_back(p, &std::free);
    return p;
  }
  void* output(size_t i, const std::vector<int64_t>& shape) override {
    const std::string why = sized_.allocate(i, shape);
    if (!why.empty()) throw std::runtime_error(why);
    return alloc(i, shape);
  }
  void* alloc(size_t i, const std::vector<int64_t>& shape) const {
    void* p = alloc_(ctx_, static_cast<int64_t>(i), static_cast<int32_t>(output_type(call_, i)),
                     static_cast<int64_t>(shape.size()), shape.data());
    if (p == nullptr) throw std::runtime_error("could not allocate output " + call_.decl().outputs()[i].name);
    return p;
  }
  const KernelSizedOutputs& sized() const { return sized_; }

 private:
  const OpCall& call_;
  OpbridgeAlloc alloc_;
  void* ctx_;
  std::vector<std::unique_ptr<void, void (*)(void*)>> blocks_;
  KernelSizedOutputs sized_;
};

// One structure's entry of abi_layout().
template <class S>
std::string layout_entry(const char* name, std::initializer_list<std::pair<const char*, std::pair<size_t, size_t>>> f) {
  std::string out = std::string("\"") + name + "\":{\"size\":" + std::to_string(sizeof(S)) + ",\"fields\":[";
  bool first = true;
  for (const auto& [field, where] : f) {
    out += (first ? "" : ",") + std::string("[\"") + field + "\"," + std::to_string(where.first) + "," +
           std::to_string(where.second) + "]";
    first = false;
  }
  return out + "]}";
}
#define OPBRIDGE_FIELD(S, m) \
  { #m, { offsetof(S, m), sizeof(S::m) } }

}  // namespace

int domain_version(const char* library) {
  int v = 1;
  for (const OpDecl* d : declared_ops(library)) v = std::max(v, d->latest_version());
  return v;
}

const char* describe_ops(const char* domain, const char* library) noexcept {
  try {
    static const std::string json = describe_ops_json(declared_ops(library), domain, domain_version(library));
    return json.c_str();
  } catch (...) {
    return "{\"error\":\"opbridge: could not describe the ops\"}";
  }
}

const char* declaration_errors(const char* library) noexcept {
  try {
    static const std::string text = [library] {
      std::string t;
      for (const OpDecl* d : declared_ops(library)) {
        if (!d->error().empty()) t += d->error() + "\n";
      }
      return t;
    }();
    return text.c_str();
  } catch (...) {
    return "opbridge: could not read the declarations\n";
  }
}

int32_t check_call(const char* op, const OpbridgeTensor* inputs, int64_t n_inputs, const OpbridgeAttr* attrs,
                   int64_t n_attrs, char* message, int64_t size, const char* library) noexcept {
  try {
    const OpDecl* decl = find_declared(op, library);
    if (decl == nullptr) return reply(message, size, StatusCode::kInvalidArgument, std::string("unknown op ") + op);
    OpCall call(*decl);
    const Status filled = fill_call(call, "OpbridgeCheckCall", inputs, n_inputs, attrs, n_attrs);
    if (!filled.ok()) return reply(message, size, filled.code(), filled.message());
    const Status st = opbridge::check_call(call);
    return reply(message, size, st.code(), st.message());
  } catch (const std::exception& e) {
    return reply(message, size, StatusCode::kRuntimeError, e.what());
  } catch (...) {
    return reply(message, size, StatusCode::kRuntimeError, "opbridge: unknown error");
  }
}

int32_t run_host(const char* op, const OpbridgeTensor* inputs, int64_t n_inputs, const OpbridgeAttr* attrs,
                 int64_t n_attrs, int32_t isa, int32_t channels_last, OpbridgeAlloc alloc, void* alloc_ctx,
                 char* message, int64_t size, const char* library) noexcept {
  try {
    const OpDecl* decl = find_declared(op, library);
    if (decl == nullptr) return reply(message, size, StatusCode::kInvalidArgument, std::string("unknown op ") + op);
    ComputeFn compute = nullptr;
    for (const OpKernel& k : registered_kernels()) {
      if (in_library(k, library) && k.device == Device::kCpu && &k.decl() == decl) compute = k.compute;
    }
    if (compute == nullptr) {
      return reply(message, size, StatusCode::kNotImplemented, "op " + decl->name() + " has no CPU kernel");
    }
    OpCall call(*decl);
    Status st = fill_call(call, "OpbridgeRunHost", inputs, n_inputs, attrs, n_attrs);
    if (st.ok()) st = opbridge::check_call(call);
    if (!st.ok()) return reply(message, size, st.code(), st.message());
    std::vector<const void*> in(call.input_count(), nullptr);
    for (size_t i = 0; i < in.size(); ++i) in[i] = call.input(i).present ? inputs[i].data : nullptr;
    std::vector<void*> out(decl->outputs().size(), nullptr);
    HostRun host(call, alloc, alloc_ctx);
    for (size_t o = 0; o < out.size(); ++o) {
      if (!sized_by_kernel(*decl, o)) out[o] = host.alloc(o, output_shape(call, o));  // else HostRun::output
    }
    KernelCall::Services s;
    s.isa = static_cast<CpuIsa>(isa);
    s.channels_last = channels_last != 0;
    s.host = &host;
    st = compute(KernelCall(call, Device::kCpu, in.data(), out.data(), s));
    if (st.ok()) {
      const std::string missing = host.sized().missing();
      if (!missing.empty()) st = Status::RuntimeError(missing);
    }
    return reply(message, size, st.code(), st.message());
  } catch (const std::bad_alloc&) {
    return reply(message, size, StatusCode::kRuntimeError, "out of memory");
  } catch (const std::exception& e) {
    return reply(message, size, StatusCode::kRuntimeError, e.what());
  } catch (...) {
    return reply(message, size, StatusCode::kRuntimeError, "opbridge: unknown error");
  }
}

const char* abi_layout() noexcept {
  try {
    static const std::string json =
        "{\"version\":" + std::to_string(OPBRIDGE_C_ABI_VERSION) + "," +
        layout_entry<OpbridgeTensor>("OpbridgeTensor",
                                     {OPBRIDGE_FIELD(OpbridgeTensor, present), OPBRIDGE_FIELD(OpbridgeTensor, type),
                                      OPBRIDGE_FIELD(OpbridgeTensor, rank), OPBRIDGE_FIELD(OpbridgeTensor, dims),
                                      OPBRIDGE_FIELD(OpbridgeTensor, data)}) +
        "," +
        layout_entry<OpbridgeAttr>("OpbridgeAttr",
                                   {OPBRIDGE_FIELD(OpbridgeAttr, present), OPBRIDGE_FIELD(OpbridgeAttr, i),
                                    OPBRIDGE_FIELD(OpbridgeAttr, f), OPBRIDGE_FIELD(OpbridgeAttr, s),
                                    OPBRIDGE_FIELD(OpbridgeAttr, n), OPBRIDGE_FIELD(OpbridgeAttr, ints),
                                    OPBRIDGE_FIELD(OpbridgeAttr, floats)}) +
        "}";
    return json.c_str();
  } catch (...) {
    return "{}";
  }
}

}  // namespace opbridge::c_abi
