// opbridge ORT adapter layer: registration (the body of every library's RegisterCustomOps).
//
// ORT calls RegisterCustomOps(options, api_base) from SessionOptions.register_custom_ops_library
// (Python) or RegisterCustomOpsLibrary / RegisterCustomOpsUsingFunction (C/C++); the library's
// entry point (OPBRIDGE_ORT_LIBRARY, entry.cpp for opbridge's own) forwards here with its
// domain. We negotiate the C API version (min of the runtime's and the headers'), wrap every
// OpSpec of the library (library_specs) into an OrtCustomOp whose `version` is capped to it, and add them all
// in one domain ("ai.opbridge" for opbridge's library).
//
// Registering again on options that already have the ops is a no-op: ORT refuses (1.31: "Domain
// already set in registry") or, in some versions, crashes on two domains of one name in a session.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ort_op.h"

namespace opbridge::ort {
namespace {

// An OrtCustomOp that carries its OpSpec. ORT only ever sees the OrtCustomOp base.
struct CustomOp : OrtCustomOp {
  OpSpec spec;
};

const OpSpec& spec_of(const OrtCustomOp* op) { return static_cast<const CustomOp*>(op)->spec; }

// What ORT holds as "the kernel": the op's own kernel object and the spec that made it.
struct Kernel {
  const OpSpec* spec;
  void* impl;
};

OrtStatus* create_kernel(const OrtCustomOp* o, const OrtKernelInfo* info, void** out) {
  *out = nullptr;
  return guard([&] {
    const OpSpec& spec = spec_of(o);
    std::unique_ptr<Kernel> k(new Kernel{&spec, nullptr});
    k->impl = spec.create(spec, info);
    *out = k.release();
  });
}

OrtStatus* compute_kernel(void* k, OrtKernelContext* ctx) {
  return guard([&] {
    auto* kernel = static_cast<Kernel*>(k);
    if (kernel == nullptr) fail(ORT_FAIL, "opbridge: kernel was not created");
    kernel->spec->compute(kernel->impl, ctx);
  });
}

// ORT 1.17 to 1.23 crash (null dereference while building the OrtShapeInferContext) on a node
// that omits an optional input with "" when its op has an InferOutputShapeFn; 1.24 fixed it.
// Measured: 1.17.3, 1.20.1, 1.23.2 crash; 1.24.1, 1.24.4, 1.26.0, 1.29.0, 1.31.1 do not.
constexpr uint32_t kSafeOptionalInputInferenceApiVersion = 24;

bool has_optional_input(const OpSpec& spec) {
  for (bool opt : spec.optional_inputs) {
    if (opt) return true;
  }
  return false;
}

// The stand-in registered for a misdeclared op (one per op name): a node of it passes model
// loading (any inputs and outputs; its outputs typed like its first input) and fails kernel
// creation, that is session creation, with the declaration's error. The library's other ops are
// registered as usual.
OpSpec refused_op(const OpSpec& spec) {
  OpSpec p;
  p.name = spec.name;
  p.decl = spec.decl;
  p.any_arity = true;
  p.inputs = {ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED};
  p.optional_inputs = {false};
  p.outputs = {ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED};
  p.create = [](const OpSpec& s, const OrtKernelInfo* info) -> void* {
    fail(ORT_NOT_IMPLEMENTED, node_label(info, s.name) + ": op " + s.decl->name() +
                                  " is misdeclared, so this library does not run it: " + s.decl->error());
  };
  p.compute = [](void*, OrtKernelContext*) {};
  p.destroy = [](void*) {};
  p.infer_shape = [](const OpSpec&, const InferIO& io) {
    // ORT gives no output count here: every output until one is refused (an op has at most 64).
    for (size_t k = 0; k < 64; ++k) {
      try {
        io.set_output_like_input(k, 0);
      } catch (const Error&) {
        return;
      }
    }
  };
  p.start_version = std::max(1, spec.decl->since_version());
  p.end_version = INT_MAX;
  return p;
}

// Fills the OrtCustomOp part of `op` (whose spec is set) for the negotiated API `version`.
void fill(CustomOp* op, uint32_t version) {
  OrtCustomOp& c = *op;
  c.version = version;
  c.GetName = [](const OrtCustomOp* o) { return spec_of(o).name; };
  c.GetExecutionProviderType = [](const OrtCustomOp* o) { return spec_of(o).provider; };
  // No callback may throw (ORT calls them through the C ABI): out-of-range indices, which ORT
  // never passes, answer UNDEFINED rather than std::vector::at's exception.
  c.GetInputTypeCount = [](const OrtCustomOp* o) { return spec_of(o).inputs.size(); };
  c.GetInputType = [](const OrtCustomOp* o, size_t i) {
    const auto& v = spec_of(o).inputs;
    return i < v.size() ? v[i] : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  };
  c.GetOutputTypeCount = [](const OrtCustomOp* o) { return spec_of(o).outputs.size(); };
  c.GetOutputType = [](const OrtCustomOp* o, size_t i) {
    const auto& v = spec_of(o).outputs;
    return i < v.size() ? v[i] : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  };
  c.GetInputCharacteristic = [](const OrtCustomOp* o, size_t i) {
    if (spec_of(o).any_arity) return INPUT_OUTPUT_VARIADIC;
    const auto& opt = spec_of(o).optional_inputs;
    return i < opt.size() && opt[i] ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  };
  c.GetOutputCharacteristic = [](const OrtCustomOp* o, size_t) {
    return spec_of(o).any_arity ? INPUT_OUTPUT_VARIADIC : INPUT_OUTPUT_REQUIRED;
  };
  c.GetInputMemoryType = [](const OrtCustomOp* o, size_t i) {
    const auto& mem = spec_of(o).input_mem;
    return i < mem.size() ? mem[i] : OrtMemTypeDefault;
  };
  c.GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  c.GetVariadicInputHomogeneity = [](const OrtCustomOp* o) { return spec_of(o).any_arity ? 0 : 1; };
  c.GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  c.GetVariadicOutputHomogeneity = [](const OrtCustomOp* o) { return spec_of(o).any_arity ? 0 : 1; };
  // V1 callbacks: ORT uses them only for ops without the V2 ones, which ours always have; they
  // still behave (no exception escapes; an error is printed since V1 cannot return it).
  c.CreateKernel = [](const OrtCustomOp* o, const OrtApi*, const OrtKernelInfo* info) -> void* {
    void* k = nullptr;
    if (OrtStatus* st = create_kernel(o, info, &k)) {
      std::fprintf(stderr, "opbridge: %s\n", api().GetErrorMessage(st));
      api().ReleaseStatus(st);
    }
    return k;
  };
  c.KernelCompute = [](void* k, OrtKernelContext* ctx) {
    if (OrtStatus* st = compute_kernel(k, ctx)) {
      std::fprintf(stderr, "opbridge: %s\n", api().GetErrorMessage(st));
      api().ReleaseStatus(st);
    }
  };
  c.KernelDestroy = [](void* k) {
    auto* kernel = static_cast<Kernel*>(k);
    if (kernel == nullptr) return;
    kernel->spec->destroy(kernel->impl);
    delete kernel;
  };
  c.CreateKernelV2 = [](const OrtCustomOp* o, const OrtApi*, const OrtKernelInfo* info, void** kernel) {
    return create_kernel(o, info, kernel);
  };
  c.KernelComputeV2 = [](void* k, OrtKernelContext* ctx) { return compute_kernel(k, ctx); };
  // Runs at model load. ORT ignores the status this returns and never releases it (1.31), so a
  // node the op's inference rejects just gets no output shape (the kernel reports the same error
  // when it runs) and the status is released here instead of leaking. Ops with optional inputs
  // get no shape inference on runtimes that would crash (see kSafeOptionalInputInferenceApiVersion):
  // ORT then infers only their output types.
  if (version >= kSafeOptionalInputInferenceApiVersion || !has_optional_input(op->spec)) {
    c.InferOutputShapeFn = [](const OrtCustomOp* o, OrtShapeInferContext* ctx) -> OrtStatus* {
      OrtStatus* st = guard([&] {
        const InferIO io(ctx);
        if (spec_of(o).infer_shape != nullptr) {
          spec_of(o).infer_shape(spec_of(o), io);
        } else {
          io.set_output_like_input(0, 0);
        }
      });
      if (st != nullptr) api().ReleaseStatus(st);
      return nullptr;
    };
  }
  c.GetStartVersion = [](const OrtCustomOp* o) { return spec_of(o).start_version; };
  c.GetEndVersion = [](const OrtCustomOp* o) { return spec_of(o).end_version; };
}

}  // namespace
}  // namespace opbridge::ort

namespace opbridge::ort {
namespace {

// "1.17.3" -> 17. ORT's C API version equals its minor version throughout the 1.x series; a
// later major version is taken as newer than any 1.x (GetApi then says whether it still serves
// our headers' version). 0: unparseable.
uint32_t runtime_api_version(const OrtApiBase* base) {
  const char* v = base->GetVersionString();
  if (v == nullptr) return 0;
  const char* dot = std::strchr(v, '.');
  const int major = std::atoi(v);
  if (dot == nullptr || major < 1) return 0;
  if (major > 1) return UINT32_MAX;
  return static_cast<uint32_t>(std::atoi(dot + 1));
}

// Session-config key marking options that already carry a library's domain (one key per domain, so
// a user's op library and opbridge's can both register on the same options). Config entries are
// copied and freed together with the options, so the mark has exactly their lifetime (a set of
// pointers would not: a new OrtSessionOptions may reuse a freed one's address).
std::string registered_key(const std::string& domain) { return "opbridge.custom_ops_registered." + domain; }

// The wrapped ops and the one domain handed to every OrtSessionOptions live until the library is
// unloaded: ORT keeps raw pointers to them for as long as any session built from the options
// exists. One shared domain keeps memory flat however many sessions register the library.
struct State {
  std::mutex mu;
  std::vector<std::unique_ptr<CustomOp>> ops;
  OrtCustomOpDomain* domain = nullptr;
  ~State() {
    if (domain != nullptr && api_version() != 0) api().ReleaseCustomOpDomain(domain);
  }
};

State& state() {
  static State s;
  return s;
}

std::string runtime_name(const OrtApiBase* base) {
  const char* v = base->GetVersionString();
  return std::string("ONNX Runtime ") + (v != nullptr ? v : "(unknown version)");
}

// An error status from a runtime whose negotiated table is unavailable (too old, or GetApi
// refused): the API-1 table exists in every ORT and has CreateStatus.
OrtStatus* early_error(const OrtApiBase* base, const std::string& message) {
  const OrtApi* oldest = base->GetApi(1);
  if (oldest == nullptr) {
    std::fprintf(stderr, "opbridge: %s\n", message.c_str());
    return nullptr;
  }
  return oldest->CreateStatus(ORT_NOT_IMPLEMENTED, message.c_str());
}

// The domain of this library's ops: set by the first register_custom_ops call.
std::string& registered_domain() {
  static std::string d = kDomain;
  return d;
}

}  // namespace

const char* domain() { return registered_domain().c_str(); }

OrtStatus* register_custom_ops(OrtSessionOptions* options, const OrtApiBase* base, const char* domain_name,
                               const char* library) noexcept {
  // Without api_base there is no way to report anything.
  if (base == nullptr) return nullptr;
  const uint32_t runtime = runtime_api_version(base);
  if (runtime < kMinOrtApiVersion) {
    return early_error(base, "opbridge needs ONNX Runtime >= 1." + std::to_string(kMinOrtApiVersion) +
                                 " (C API " + std::to_string(kMinOrtApiVersion) + "); this is " +
                                 runtime_name(base) + ". Upgrade onnxruntime.");
  }
  const uint32_t version = runtime < ORT_API_VERSION ? runtime : ORT_API_VERSION;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (api_version() == 0) {
    const OrtApi* table = base->GetApi(version);
    if (table == nullptr) {
      return early_error(base, "opbridge: " + runtime_name(base) + " does not provide C API version " +
                                   std::to_string(version) + " (this library needs 1." +
                                   std::to_string(kMinOrtApiVersion) + " to 1." +
                                   std::to_string(ORT_API_VERSION) + ")");
    }
    set_api(table, version);
  }
  return guard([&] {
    if (options == nullptr) fail(ORT_INVALID_ARGUMENT, "opbridge: RegisterCustomOps got null session options");
    if (domain_name == nullptr || *domain_name == '\0') {
      fail(ORT_INVALID_ARGUMENT, "opbridge: the custom-op domain of a library must not be empty");
    }
    if (s.domain != nullptr && registered_domain() != domain_name) {
      fail(ORT_INVALID_ARGUMENT, std::string("opbridge: this library registers its ops in domain '") +
                                     registered_domain() + "', not '" + domain_name + "'");
    }
    const std::string key = registered_key(domain_name);
    int registered = 0;
    check(api().HasSessionConfigEntry(options, key.c_str(), &registered));
    if (registered != 0) return;
    if (s.domain == nullptr) {
      // Built aside and committed at the end, so that a failure leaves the state as it was.
      std::vector<std::unique_ptr<CustomOp>> ops;
      // Declared ops serve their versions up to the newest any of the library's ops has. ORT
      // (1.31) makes one schema per custom-op name, since the first registration's start version,
      // and never compares a model's import of the domain with a kernel's end version, so this
      // does not by itself refuse a model of a newer version: opbridge.InferenceSession and
      // `opbridge check` do (opbridge/onnx/_declared_export.py, attribute_problems).
      const int newest = c_abi::domain_version(library);
      std::vector<const OpDecl*> refused;
      for (const OpSpec& library_spec : library_specs(library)) {
        OpSpec spec = library_spec;
        if (!spec.decl->error().empty()) {
          // One stand-in per misdeclared op, for all its element types and providers.
          if (std::find(refused.begin(), refused.end(), spec.decl) != refused.end()) continue;
          refused.push_back(spec.decl);
          spec = refused_op(spec);
        }
        for (const auto& other : ops) {
          const OpSpec& o = other->spec;
          if (std::strcmp(o.name, spec.name) == 0 && (o.provider == nullptr) == (spec.provider == nullptr) &&
              (o.provider == nullptr || std::strcmp(o.provider, spec.provider) == 0) && o.inputs == spec.inputs &&
              o.decl != spec.decl) {
            fail(ORT_INVALID_ARGUMENT, "opbridge: op '" + std::string(spec.name) + "' is registered twice in domain '" +
                                           domain_name + "' (two declarations of one name)");
          }
        }
        // Value-initialized: OrtCustomOp members we do not set (GetMayInplace, GetAliasMap, ...)
        // stay null, which ORT reads as "not provided".
        auto op = std::make_unique<CustomOp>();
        op->spec = spec;
        if (op->spec.start_version == 0) op->spec.start_version = spec.decl->since_version();
        if (op->spec.end_version == 0) op->spec.end_version = newest;
        fill(op.get(), api_version());
        ops.push_back(std::move(op));
      }
      OrtCustomOpDomain* domain = nullptr;
      check(api().CreateCustomOpDomain(domain_name, &domain));
      std::unique_ptr<OrtCustomOpDomain, void (*)(OrtCustomOpDomain*)> holder(
          domain, [](OrtCustomOpDomain* d) { api().ReleaseCustomOpDomain(d); });
      for (auto& op : ops) check(api().CustomOpDomain_Add(domain, op.get()));
      s.ops = std::move(ops);
      s.domain = holder.release();
      registered_domain() = domain_name;
    }
    check(api().AddCustomOpDomain(options, s.domain));
    check(api().AddSessionConfigEntry(options, key.c_str(), "1"));
  });
}

}  // namespace opbridge::ort
