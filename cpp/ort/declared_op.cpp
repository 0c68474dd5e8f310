// opbridge ORT adapter layer: the generic kernel. Everything ORT needs of an op — element types,
// optional and host-memory inputs, typed attributes with defaults, shape inference — comes from
// its declaration (opbridge/op_decl.h); the op supplies only its compute functions
// (opbridge/kernel.h), which the generic kernel below serves on the CPU and CUDA execution
// providers.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ort_op.h"

namespace opbridge::ort {

namespace {

ONNXTensorElementDataType onnx_elem(ElemType t) { return static_cast<ONNXTensorElementDataType>(t); }

// ---------------------------------------------------------------- attributes at kernel creation

bool failed(OrtStatus* st) {
  if (st == nullptr) return false;
  api().ReleaseStatus(st);
  return true;
}

// The type an attribute is set with, probing each getter (ORT reports "missing" and "wrong type"
// alike); nullptr when the node does not set it.
const char* attr_type_set(const OrtKernelInfo* info, const char* name) {
  int64_t i = 0;
  float f = 0;
  size_t size = 0;
  if (!failed(api().KernelInfoGetAttribute_int64(info, name, &i))) return "an int";
  if (!failed(api().KernelInfoGetAttribute_float(info, name, &f))) return "a float";
  if (!failed(api().KernelInfoGetAttribute_string(info, name, nullptr, &size))) return "a string";
  size = 0;
  if (!failed(api().KernelInfoGetAttributeArray_int64(info, name, nullptr, &size))) return "a list of ints";
  size = 0;
  if (!failed(api().KernelInfoGetAttributeArray_float(info, name, nullptr, &size))) return "a list of floats";
  return nullptr;
}

// Reads attribute `a` of the node; false when it is not set. Throws for another type.
bool read_kernel_attr(const OrtKernelInfo* info, const ArgDecl& a, AttrValue* out) {
  const char* name = a.onnx_name.c_str();
  const char* got = attr_type_set(info, name);
  if (got == nullptr) return false;
  AttrValue v;
  v.type = a.attr_type;
  bool ok = false;
  switch (a.attr_type) {
    case AttrType::kInt:
    case AttrType::kBool:
      ok = !failed(api().KernelInfoGetAttribute_int64(info, name, &v.i));
      break;
    case AttrType::kFloat: {
      float f = 0;
      ok = !failed(api().KernelInfoGetAttribute_float(info, name, &f));
      v.f = f;
      break;
    }
    case AttrType::kString: {
      size_t size = 0;
      if (!failed(api().KernelInfoGetAttribute_string(info, name, nullptr, &size))) {
        std::string s(size, '\0');
        ok = !failed(api().KernelInfoGetAttribute_string(info, name, s.data(), &size));
        s.resize(std::strlen(s.c_str()));
        v.s = s;
      }
      break;
    }
    case AttrType::kInts: {
      size_t size = 0;
      if (!failed(api().KernelInfoGetAttributeArray_int64(info, name, nullptr, &size))) {
        v.ints.resize(size);
        ok = size == 0 || !failed(api().KernelInfoGetAttributeArray_int64(info, name, v.ints.data(), &size));
      }
      break;
    }
    case AttrType::kFloats: {
      size_t size = 0;
      if (!failed(api().KernelInfoGetAttributeArray_float(info, name, nullptr, &size))) {
        std::vector<float> f(size);
        ok = size == 0 || !failed(api().KernelInfoGetAttributeArray_float(info, name, f.data(), &size));
        v.floats.assign(f.begin(), f.end());
      }
      break;
    }
  }
  if (!ok) {
    fail(ORT_INVALID_ARGUMENT, "attribute '" + a.onnx_name + "' must be " +
                                   (a.attr_type == AttrType::kBool ? std::string("an int (0 or 1)")
                                                                   : std::string(attr_type_name(a.attr_type))) +
                                   ", got " + got);
  }
  *out = std::move(v);
  return true;
}

// ---------------------------------------------------------------- the generic kernel

struct DeclaredKernel {
  const OpSpec* spec;
  std::string label;
  std::vector<AttrValue> attrs;  // declaration order, defaults applied
};

// What one call of a registered compute function is lent: scratch memory from the execution
// provider's allocator (device memory on CUDA), in the memory of input `like_input`; and the
// outputs the kernel sizes ("?" in their rule), from ORT.
class OrtHost final : public KernelHost {
 public:
  OrtHost(const KernelIO& io, size_t like_input, const OpCall& call, const std::string& label)
      : io_(io), like_(like_input), label_(label), sized_(call) {}
  void* scratch(size_t bytes) override {
    blocks_.push_back(io_.scratch(bytes, like_));
    return blocks_.back().get();
  }
  void* output(size_t i, const std::vector<int64_t>& shape) override {
    const std::string why = sized_.allocate(i, shape);
    if (!why.empty()) fail(ORT_RUNTIME_EXCEPTION, label_ + ": " + why);
    return io_.output(i, shape);
  }
  const KernelSizedOutputs& sized() const { return sized_; }

 private:
  const KernelIO& io_;
  size_t like_;
  const std::string& label_;
  std::vector<Scratch> blocks_;
  KernelSizedOutputs sized_;
};

// The generic kernel of a registered compute function: the checked call, the inputs as ORT has
// them (contiguous), the outputs allocated from the declaration's rules, ORT's thread pool or
// compute stream.
void run_kernel(const OpSpec& spec, const KernelIO& io, const OpCall& call, const std::vector<Input>& inputs,
                const std::string& label) {
  const OpDecl& d = *spec.decl;
  const bool cuda = spec.provider != nullptr;
  std::vector<const void*> in(inputs.size(), nullptr);
  size_t like = 0;
  bool have_like = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].present) continue;
    in[i] = inputs[i].data;
    if (!have_like && !d.inputs()[i]->host_memory) {
      like = i;
      have_like = true;
    }
  }
  std::vector<void*> out(d.outputs().size(), nullptr);
  for (size_t o = 0; o < out.size(); ++o) {
    if (!sized_by_kernel(d, o)) out[o] = io.output(o, output_shape(call, o));  // else OrtHost::output
  }
  const ParallelFor pf = cuda ? ParallelFor() : io.parallel();
  OrtHost host(io, like, call, label);
  KernelCall::Services s;
  s.parallel = &pf;
  s.stream = cuda ? io.gpu_stream() : nullptr;
  s.host = &host;
  const KernelCall k(call, cuda ? Device::kCuda : Device::kCpu, in.data(), out.data(), s);
  check(spec.kernel(k), label);
  const std::string missing = host.sized().missing();
  if (!missing.empty()) fail(ORT_RUNTIME_EXCEPTION, label + ": " + missing);
}

// The value of an attribute the node does not set: the declared default, with float defaults
// rounded to float32 (float_attribute), so that leaving epsilon out runs as epsilon=1e-5 written
// in the model, and as torch's default.
AttrValue onnx_default(const ArgDecl& a) {
  AttrValue v = a.default_value;
  if (v.type == AttrType::kFloat) v.f = float_attribute(v.f);
  for (double& f : v.floats) f = float_attribute(f);
  return v;
}

void* create_declared(const OpSpec& spec, const OrtKernelInfo* info) {
  const OpDecl& d = *spec.decl;
  auto k = std::make_unique<DeclaredKernel>();
  k->spec = &spec;
  k->label = node_label(info, d.onnx_type().c_str());
  try {
    for (const ArgDecl* a : d.attrs()) {
      AttrValue v = onnx_default(*a);
      if (!read_kernel_attr(info, *a, &v) && a->required) {
        static const char* const kKind[] = {"int", "float", "string", "bool", "ints", "floats"};
        fail(ORT_INVALID_ARGUMENT, std::string("required ") + kKind[static_cast<int>(a->attr_type)] + " attribute '" +
                                       a->onnx_name + "' is missing");
      }
      k->attrs.push_back(std::move(v));
    }
  } catch (const Error& e) {
    fail(ORT_INVALID_ARGUMENT, k->label + ": " + e.what());
  }
  OpCall call(d);
  for (size_t i = 0; i < k->attrs.size(); ++i) call.attr(i) = k->attrs[i];
  check(check_attributes(call), k->label);
  return k.release();
}

void compute_declared(void* kernel, OrtKernelContext* raw) {
  auto* k = static_cast<DeclaredKernel*>(kernel);
  const OpDecl& d = *k->spec->decl;
  const KernelIO io(raw);
  OpCall call(d);
  std::vector<Input> inputs(d.inputs().size());
  const size_t n = io.input_count();
  const bool on_cpu = k->spec->provider == nullptr;
  for (size_t i = 0; i < inputs.size() && i < n; ++i) {
    inputs[i] = io.input(i);
    TensorArg& t = call.input(i);
    t.present = inputs[i].present;
    if (!t.present) continue;
    t.type = static_cast<ElemType>(inputs[i].type);
    t.shape = inputs[i].shape;
    // Host data only where it is on the host: every input on the CPU provider, host_memory
    // inputs (declared CPU inputs) elsewhere. Validation reads it for host_memory inputs only.
    if (on_cpu || d.inputs()[i]->host_memory) t.data = inputs[i].data;
  }
  for (size_t i = 0; i < k->attrs.size(); ++i) call.attr(i) = k->attrs[i];
  check(check_call(call), k->label);
  run_kernel(*k->spec, io, call, inputs, k->label);
}

void destroy_declared(void* kernel) { delete static_cast<DeclaredKernel*>(kernel); }

// ---------------------------------------------------------------- shape inference

void infer_declared(const OpSpec& spec, const InferIO& io) {
  const OpDecl& d = *spec.decl;
  const std::string label = std::string(domain()) + "::" + d.onnx_type();
  OpCall call(d);
  const size_t n = io.input_count();
  for (size_t i = 0; i < d.inputs().size() && i < n; ++i) {
    const InferInput in = io.input(i);
    TensorArg& t = call.input(i);
    t.present = in.present;
    t.type = static_cast<ElemType>(in.type);
    t.shape = in.shape;
    // ORT reports an input of unknown rank as rank 0 (see InferInput::shape).
    if (in.present && in.shape.empty() && d.inputs()[i]->rank != 0) t.rank_known = false;
  }
  try {
    for (size_t i = 0; i < d.attrs().size(); ++i) {
      call.attr(i) = onnx_default(*d.attrs()[i]);
      io.read_attr(*d.attrs()[i], &call.attr(i));
    }
  } catch (const Error& e) {
    fail(ORT_INVALID_ARGUMENT, label + ": " + e.what());
  }
  check(check_call(call), label);
  for (size_t o = 0; o < d.outputs().size(); ++o) {
    const OutputDecl& out = d.outputs()[o];
    if (out.like_input >= 0 && d.inputs()[static_cast<size_t>(out.like_input)]->type_var == out.type_var &&
        d.output_shape_function() == nullptr) {
      io.set_output_like_input(o, static_cast<size_t>(out.like_input));
      continue;
    }
    const ElemType type = output_type(call, o);
    if (type == ElemType::kUndefined) continue;
    std::vector<int64_t> dims = output_shape(call, o);
    std::vector<std::string> symbols(dims.size());
    if (d.output_shape_function() != nullptr) {
      // the op's own function: sizes only, no symbols
    } else if (out.like_input >= 0) {
      if (!call.input(static_cast<size_t>(out.like_input)).rank_known) continue;
      symbols = io.input_symbols(static_cast<size_t>(out.like_input));
    } else {
      // A dimension copied from one input dimension keeps its symbol.
      for (size_t k = 0; k < out.dims.size(); ++k) {
        const auto& expr = out.dims[k];
        if (expr.size() == 1 && expr[0].kind == DimTerm::kInputDim) {
          const TensorArg& src = call.input(static_cast<size_t>(expr[0].a));
          if (!src.present || !src.rank_known) continue;
          const auto names = io.input_symbols(static_cast<size_t>(expr[0].a));
          int64_t axis = expr[0].b < 0 ? expr[0].b + src.rank() : expr[0].b;
          if (axis >= 0 && axis < static_cast<int64_t>(names.size())) symbols[k] = names[static_cast<size_t>(axis)];
        }
      }
    }
    io.set_output(o, onnx_elem(type), dims, symbols);
  }
}

}  // namespace

std::vector<OpSpec> kernel_op_specs(const OpKernel& kernel) {
  const OpDecl& decl = kernel.decl();
  const char* provider = kernel.device == Device::kCuda ? "CUDAExecutionProvider" : nullptr;
  if (!decl.error().empty()) {
    // Misdeclared: its types may mean nothing; register_custom_ops registers a stand-in for it.
    OpSpec s;
    s.name = decl.onnx_type().c_str();
    s.provider = provider;
    s.decl = &decl;
    s.kernel = kernel.compute;
    return {s};
  }
  // Every combination of the type variables' element types.
  std::vector<std::vector<ElemType>> combos{{}};
  for (const TypeVarDecl& tv : decl.type_vars()) {
    std::vector<std::vector<ElemType>> next;
    for (const auto& c : combos) {
      for (ElemType e : tv.types) {
        next.push_back(c);
        next.back().push_back(e);
      }
    }
    combos = std::move(next);
  }
  const auto bound = [&](const std::vector<ElemType>& combo, const std::string& var) {
    for (size_t i = 0; i < decl.type_vars().size(); ++i) {
      if (decl.type_vars()[i].name == var) return onnx_elem(combo[i]);
    }
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  };
  std::vector<OpSpec> specs;
  for (const auto& combo : combos) {
    OpSpec s;
    s.name = decl.onnx_type().c_str();
    s.provider = provider;
    s.decl = &decl;
    s.kernel = kernel.compute;
    bool any_host = false;
    for (const ArgDecl* in : decl.inputs()) {
      s.inputs.push_back(bound(combo, in->type_var));
      s.optional_inputs.push_back(in->optional);
      any_host = any_host || in->host_memory;
    }
    if (provider != nullptr && any_host) {
      for (const ArgDecl* in : decl.inputs()) s.input_mem.push_back(in->host_memory ? OrtMemTypeCPUInput : OrtMemTypeDefault);
    }
    for (const OutputDecl& o : decl.outputs()) s.outputs.push_back(bound(combo, o.type_var));
    s.create = create_declared;
    s.compute = compute_declared;
    s.destroy = destroy_declared;
    s.infer_shape = infer_declared;
    specs.push_back(std::move(s));
  }
  return specs;
}

const std::vector<OpSpec>& library_specs(const char* library) {
  static const std::vector<OpSpec>* specs = [library] {
    auto* all = new std::vector<OpSpec>();  // never freed: ORT holds the specs' ops
    for (const OpKernel& k : registered_kernels()) {
      if (!in_library(k, library)) continue;
      for (OpSpec& s : kernel_op_specs(k)) all->push_back(std::move(s));
    }
    return all;
  }();
  return *specs;
}

// ---------------------------------------------------------------- InferIO: attributes, symbolic dimensions

namespace {
const OrtOpAttr* node_attr(OrtShapeInferContext* ctx, const char* name) {
  const OrtOpAttr* attr = nullptr;
  if (failed(api().ShapeInferContext_GetAttribute(ctx, name, &attr))) return nullptr;
  return attr;
}

// ReadOpAttr of a list or string: first the size, then the data.
template <class E>
bool read_list(const OrtOpAttr* attr, OrtOpAttrType type, std::vector<E>* out) {
  size_t bytes = 0;
  OrtStatus* st = api().ReadOpAttr(attr, type, nullptr, 0, &bytes);
  if (st != nullptr) api().ReleaseStatus(st);  // "size too small" is expected here
  if (bytes == 0) {
    out->clear();
    // An empty list and a wrong type both report 0 bytes: tell them apart by a read into an
    // empty buffer, which succeeds only for the right type.
    return !failed(api().ReadOpAttr(attr, type, nullptr, 0, &bytes));
  }
  out->resize((bytes + sizeof(E) - 1) / sizeof(E));
  return !failed(api().ReadOpAttr(attr, type, out->data(), out->size() * sizeof(E), &bytes));
}
}  // namespace

bool InferIO::read_attr(const ArgDecl& a, AttrValue* out) const {
  const OrtOpAttr* attr = node_attr(ctx_, a.onnx_name.c_str());
  if (attr == nullptr) return false;
  AttrValue v;
  v.type = a.attr_type;
  size_t written = 0;
  bool ok = false;
  switch (a.attr_type) {
    case AttrType::kInt:
    case AttrType::kBool:
      ok = !failed(api().ReadOpAttr(attr, ORT_OP_ATTR_INT, &v.i, sizeof(v.i), &written));
      break;
    case AttrType::kFloat: {
      float f = 0;
      ok = !failed(api().ReadOpAttr(attr, ORT_OP_ATTR_FLOAT, &f, sizeof(f), &written));
      v.f = f;
      break;
    }
    case AttrType::kString: {
      std::vector<char> chars;
      ok = read_list(attr, ORT_OP_ATTR_STRING, &chars);
      v.s.assign(chars.begin(), chars.end());
      v.s.resize(std::strlen(v.s.c_str()));
      break;
    }
    case AttrType::kInts:
      ok = read_list(attr, ORT_OP_ATTR_INTS, &v.ints);
      break;
    case AttrType::kFloats: {
      std::vector<float> f;
      ok = read_list(attr, ORT_OP_ATTR_FLOATS, &f);
      v.floats.assign(f.begin(), f.end());
      break;
    }
  }
  if (!ok) fail(ORT_INVALID_ARGUMENT, "attribute '" + a.onnx_name + "' must be " + attr_type_name(a.attr_type));
  *out = std::move(v);
  return true;
}

std::vector<std::string> InferIO::input_symbols(size_t index) const {
  OrtTensorTypeAndShapeInfo* info = nullptr;  // context-owned
  if (failed(api().ShapeInferContext_GetInputTypeShape(ctx_, index, &info))) return {};
  size_t rank = 0;
  check(api().GetDimensionsCount(info, &rank));
  std::vector<const char*> names(rank, nullptr);
  check(api().GetSymbolicDimensions(info, names.data(), rank));
  std::vector<std::string> out(rank);
  for (size_t i = 0; i < rank; ++i) out[i] = names[i] != nullptr ? names[i] : "";
  return out;
}

}  // namespace opbridge::ort
