// The generic ORT kernel of a declared op: reads the node's attributes at kernel creation (with
// the declared defaults), checks each call against the declaration and runs the op's compute
// function (opbridge/kernel.h) on the CPU or CUDA execution provider.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "declared_op.h"

namespace opbridge::ort {

using detail::failed;

namespace {

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

}  // namespace

namespace detail {

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

}  // namespace detail

}  // namespace opbridge::ort
