// opbridge ORT custom-op library entry point: RegisterCustomOps.
//
// ORT calls RegisterCustomOps(options, api_base) from SessionOptions.register_custom_ops_library
// (Python) or RegisterCustomOpsLibrary / RegisterCustomOpsUsingFunction (C/C++). We negotiate the
// C API version (min of the runtime's and the headers'), wrap every OpSpec of op_registry() into an
// OrtCustomOp whose `version` is capped to it, and add them all in one "ai.opbridge" domain.
#include <atomic>
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
  // ORT (1.17 to 1.31) writes a dimension without a symbolic name as dim_value, so an unknown
  // dimension (-1) handed back unchanged becomes a literal -1: its optimizer then folds a
  // downstream Shape(Y) into the constant [-1, ...]. Give every unknown dimension a symbol of
  // its own instead (unique, so that no two unknown dimensions are taken as equal).
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  check(api().GetTensorElementType(info, &type));
  std::vector<int64_t> dims(rank);
  check(api().GetDimensions(info, dims.data(), rank));
  std::vector<const char*> names(rank, nullptr);
  check(api().GetSymbolicDimensions(info, names.data(), rank));
  std::vector<std::string> symbols(rank);
  std::vector<const char*> symbol_ptrs(rank);
  for (size_t i = 0; i < rank; ++i) {
    if (names[i] != nullptr && names[i][0] != '\0') {
      symbols[i] = names[i];
    } else if (dims[i] < 0) {
      static std::atomic<uint64_t> counter{0};
      symbols[i] = "opbridge_unk_" + std::to_string(counter.fetch_add(1));
    }
    symbol_ptrs[i] = symbols[i].c_str();
  }
  OrtTensorTypeAndShapeInfo* out = nullptr;
  check(api().CreateTensorTypeAndShapeInfo(&out));
  std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)> holder(
      out, [](OrtTensorTypeAndShapeInfo* p) { api().ReleaseTensorTypeAndShapeInfo(p); });
  check(api().SetTensorElementType(out, type));
  check(api().SetDimensions(out, dims.data(), rank));
  check(api().SetSymbolicDimensions(out, symbol_ptrs.data(), rank));
  check(api().ShapeInferContext_SetOutputTypeShape(ctx, 0, out));
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

OrtStatus* register_ops(OrtSessionOptions* options, const OrtApiBase* base) {
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
    if (s.ops.empty()) {
      for (const OpSpec& spec : op_registry()) {
        auto op = std::make_unique<CustomOp>();
        fill(op.get(), version);
        op->spec = spec;
        s.ops.push_back(std::move(op));
      }
    }
    OrtCustomOpDomain* domain = nullptr;
    check(api().CreateCustomOpDomain(kDomain, &domain));
    s.domains.push_back(domain);
    for (auto& op : s.ops) check(api().CustomOpDomain_Add(domain, op.get()));
    check(api().AddCustomOpDomain(options, domain));
  });
}

}  // namespace
}  // namespace opbridge::ort

extern "C" {
// The one symbol the library exports (see cmake/ort_exports.map).
__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                 const OrtApiBase* api_base) {
  if (options == nullptr || api_base == nullptr) return nullptr;
  return opbridge::ort::register_ops(options, api_base);
}
}
