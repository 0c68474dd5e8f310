// opbridge ORT adapter layer: registration (the body of every library's RegisterCustomOps).
//
// ORT calls RegisterCustomOps(options, api_base) from SessionOptions.register_custom_ops_library
// (Python) or RegisterCustomOpsLibrary / RegisterCustomOpsUsingFunction (C/C++); the library's
// entry point (OPBRIDGE_ORT_LIBRARY_ENTRY, entry.cpp for opbridge's own) forwards here with its
// domain. We negotiate the C API version (min of the runtime's and the headers'), wrap every
// OpSpec of op_registry() into an OrtCustomOp whose `version` is capped to it, and add them all
// in one domain ("ai.opbridge" for opbridge's library).
#include <climits>
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
    k->impl = spec.create(info);
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

OrtStatus* infer_default(OrtShapeInferContext* ctx) {
  // The context owns the info it hands out (ORT's own C++ wrapper release()s it): never free it.
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(api().ShapeInferContext_GetInputTypeShape(ctx, 0, &info));
  // ORT reports an input of unknown rank as rank 0; passing that on would declare a scalar
  // output. Our ops take no scalars, so rank 0 means "unknown": leave the output to ORT.
  size_t rank = 0;
  check(api().GetDimensionsCount(info, &rank));
  if (rank == 0) return nullptr;
  check(api().ShapeInferContext_SetOutputTypeShape(ctx, 0, info));
  return nullptr;
}

void fill(CustomOp* op, uint32_t version) {
  OrtCustomOp& c = *op;
  c.version = version;
  c.GetName = [](const OrtCustomOp* o) { return spec_of(o).name; };
  c.GetExecutionProviderType = [](const OrtCustomOp* o) { return spec_of(o).provider; };
  c.GetInputTypeCount = [](const OrtCustomOp* o) { return spec_of(o).inputs.size(); };
  c.GetInputType = [](const OrtCustomOp* o, size_t i) { return spec_of(o).inputs.at(i); };
  c.GetOutputTypeCount = [](const OrtCustomOp* o) { return spec_of(o).outputs.size(); };
  c.GetOutputType = [](const OrtCustomOp* o, size_t i) { return spec_of(o).outputs.at(i); };
  c.GetInputCharacteristic = [](const OrtCustomOp* o, size_t i) {
    const auto& opt = spec_of(o).optional_inputs;
    return i < opt.size() && opt[i] ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  };
  c.GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  c.GetInputMemoryType = [](const OrtCustomOp* o, size_t i) {
    const auto& mem = spec_of(o).input_mem;
    return i < mem.size() ? mem[i] : OrtMemTypeDefault;
  };
  c.GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  c.GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  c.GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  c.GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
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
  c.InferOutputShapeFn = [](const OrtCustomOp* o, OrtShapeInferContext* ctx) {
    return guard([&] {
      if (spec_of(o).infer_shape != nullptr) {
        spec_of(o).infer_shape(ctx);
      } else {
        infer_default(ctx);
      }
    });
  };
  c.GetStartVersion = [](const OrtCustomOp*) { return 1; };
  c.GetEndVersion = [](const OrtCustomOp*) { return INT_MAX; };
}

}  // namespace
}  // namespace opbridge::ort

namespace opbridge::ort {
namespace {

// "1.17.3" -> 17. ORT's C API version equals its minor version throughout the 1.x series.
uint32_t runtime_api_version(const OrtApiBase* base) {
  const char* v = base->GetVersionString();
  if (v == nullptr) return 0;
  const char* dot = std::strchr(v, '.');
  if (dot == nullptr || std::atoi(v) != 1) return 0;
  return static_cast<uint32_t>(std::atoi(dot + 1));
}

// The wrapped ops and the domains handed to ORT live until the library is unloaded: ORT keeps
// raw pointers to them for as long as any session built from the options exists.
struct State {
  std::mutex mu;
  std::vector<std::unique_ptr<CustomOp>> ops;
  std::vector<OrtCustomOpDomain*> domains;
  ~State() {
    if (g_api_ok) {
      for (OrtCustomOpDomain* d : domains) api().ReleaseCustomOpDomain(d);
    }
  }
  static inline bool g_api_ok = false;
};

State& state() {
  static State s;
  return s;
}

// The domain of this library's ops: set by the first register_custom_ops call.
std::string& registered_domain() {
  static std::string d = kDomain;
  return d;
}

}  // namespace

const char* domain() { return registered_domain().c_str(); }

OrtStatus* register_custom_ops(OrtSessionOptions* options, const OrtApiBase* base, const char* domain_name) noexcept {
  if (options == nullptr || base == nullptr) return nullptr;
  const uint32_t runtime = runtime_api_version(base);
  if (runtime < kMinOrtApiVersion) {
    // The API-1 table always exists and has CreateStatus.
    const OrtApi* oldest = base->GetApi(1);
    std::string msg = std::string("opbridge needs ONNX Runtime >= 1.") + std::to_string(kMinOrtApiVersion) +
                      " (C API " + std::to_string(kMinOrtApiVersion) + "); this runtime is " +
                      (base->GetVersionString() ? base->GetVersionString() : "unknown");
    return oldest ? oldest->CreateStatus(ORT_NOT_IMPLEMENTED, msg.c_str()) : nullptr;
  }
  const uint32_t version = runtime < ORT_API_VERSION ? runtime : ORT_API_VERSION;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (api_version() == 0) {
    set_api(base->GetApi(version), version);
    State::g_api_ok = true;
  }
  return guard([&] {
    if (domain_name == nullptr || *domain_name == '\0') {
      fail(ORT_INVALID_ARGUMENT, "opbridge: the custom-op domain of a library must not be empty");
    }
    if (s.ops.empty()) {
      registered_domain() = domain_name;
    } else if (registered_domain() != domain_name) {
      fail(ORT_INVALID_ARGUMENT, std::string("opbridge: this library registers its ops in domain '") +
                                     registered_domain() + "', not '" + domain_name + "'");
    }
    if (s.ops.empty()) {
      for (const OpSpec& spec : op_registry()) {
        auto op = std::make_unique<CustomOp>();
        fill(op.get(), version);
        op->spec = spec;
        s.ops.push_back(std::move(op));
      }
    }
    OrtCustomOpDomain* domain = nullptr;
    check(api().CreateCustomOpDomain(registered_domain().c_str(), &domain));
    s.domains.push_back(domain);
    for (auto& op : s.ops) check(api().CustomOpDomain_Add(domain, op.get()));
    check(api().AddCustomOpDomain(options, domain));
  });
}

}  // namespace opbridge::ort
