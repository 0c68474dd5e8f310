#include "torch_common.h"

#include <torch/csrc/stable/ops.h>

#include <dlfcn.h>

#include <cmath>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace opbridge::torch_adapter {

// ---------------------------------------------------------------- errors

void throw_error(const char* tag, std::string_view qualname, std::string_view message) {
  std::string s;
  s.reserve((tag ? 24 : 0) + qualname.size() + message.size() + 2);
  if (tag != nullptr) s.append(tag).append(": ");
  s.append(qualname).append(": ").append(message);
  throw std::runtime_error(s);
}

void check_status(const Status& status, std::string_view qualname) {
  if (status.ok()) return;
  switch (status.code()) {
    case StatusCode::kInvalidArgument: throw_error(kValueErrorTag, qualname, status.message());
    case StatusCode::kTypeError: throw_error(kTypeErrorTag, qualname, status.message());
    case StatusCode::kNotImplemented: throw_error(kNotImplementedTag, qualname, status.message());
    case StatusCode::kLinAlgError: throw_error(kLinAlgErrorTag, qualname, status.message());
    default: throw_error(nullptr, qualname, status.message());
  }
}

// ---------------------------------------------------------------- tensors

namespace {

void shim_check(AOTITorchError err, const char* what) {
  if (err != AOTI_TORCH_SUCCESS) throw std::runtime_error(std::string("opbridge: torch's C shim failed in ") + what);
}

// The C shim's device type of a tensor (aoti_torch_device_type_*()).
int32_t device_type(const Tensor& t) {
  int32_t v = 0;
  shim_check(aoti_torch_get_device_type(t.get(), &v), "aoti_torch_get_device_type");
  return v;
}

// The shim's numbers of the dtypes the kernels use, asked once.
struct ShimDtypes {
  int32_t f32 = aoti_torch_dtype_float32(), f64 = aoti_torch_dtype_float64(), f16 = aoti_torch_dtype_float16(),
          bf16 = aoti_torch_dtype_bfloat16(), i64 = aoti_torch_dtype_int64(), u8 = aoti_torch_dtype_uint8();
};
const ShimDtypes& shim_dtypes() {
  static const ShimDtypes d;
  return d;
}

int32_t shim_dtype(ScalarType t) {
  const ShimDtypes& d = shim_dtypes();
  switch (t) {
    case ScalarType::Float: return d.f32;
    case ScalarType::Double: return d.f64;
    case ScalarType::Half: return d.f16;
    case ScalarType::BFloat16: return d.bf16;
    case ScalarType::Long: return d.i64;
    case ScalarType::Byte: return d.u8;
    default: return torch::stable::detail::to<int32_t>(torch::stable::detail::from(t));
  }
}

}  // namespace

ScalarType dtype(const Tensor& t) {
  int32_t v = 0;
  shim_check(aoti_torch_get_dtype(t.get(), &v), "aoti_torch_get_dtype");
  const ShimDtypes& d = shim_dtypes();
  if (v == d.f32) return ScalarType::Float;
  if (v == d.f64) return ScalarType::Double;
  if (v == d.f16) return ScalarType::Half;
  if (v == d.bf16) return ScalarType::BFloat16;
  if (v == d.i64) return ScalarType::Long;
  return t.scalar_type();
}

ElemType elem_type(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return ElemType::kFloat32;
    case ScalarType::Double: return ElemType::kFloat64;
    case ScalarType::Half: return ElemType::kFloat16;
    case ScalarType::BFloat16: return ElemType::kBFloat16;
    case ScalarType::Byte: return ElemType::kUint8;
    case ScalarType::Char: return ElemType::kInt8;
    case ScalarType::Short: return ElemType::kInt16;
    case ScalarType::Int: return ElemType::kInt32;
    case ScalarType::Long: return ElemType::kInt64;
    case ScalarType::Bool: return ElemType::kBool;
    case ScalarType::ComplexFloat: return ElemType::kComplex64;
    case ScalarType::ComplexDouble: return ElemType::kComplex128;
    default: return ElemType::kUndefined;
  }
}

ScalarType scalar_type(ElemType t) {
  switch (t) {
    case ElemType::kFloat32: return ScalarType::Float;
    case ElemType::kFloat64: return ScalarType::Double;
    case ElemType::kFloat16: return ScalarType::Half;
    case ElemType::kBFloat16: return ScalarType::BFloat16;
    case ElemType::kUint8: return ScalarType::Byte;
    case ElemType::kInt8: return ScalarType::Char;
    case ElemType::kInt16: return ScalarType::Short;
    case ElemType::kInt32: return ScalarType::Int;
    case ElemType::kInt64: return ScalarType::Long;
    case ElemType::kBool: return ScalarType::Bool;
    case ElemType::kComplex64: return ScalarType::ComplexFloat;
    case ElemType::kComplex128: return ScalarType::ComplexDouble;
    default: throw std::runtime_error(std::string("opbridge: no torch dtype for element type ") + elem_type_name(t));
  }
}

std::vector<int64_t> sizes(const Tensor& t) {
  const auto s = t.sizes();
  return std::vector<int64_t>(s.begin(), s.end());
}

std::string device_string(const Tensor& t) {
  const int32_t type = device_type(t);
  if (type == aoti_torch_device_type_cpu()) return "cpu";
  const std::string name = type == aoti_torch_device_type_cuda() ? "cuda" : "device type " + std::to_string(type);
  return name + ":" + std::to_string(t.get_device_index());
}

bool same_device(const Tensor& a, const Tensor& b) {
  const int32_t ta = device_type(a);
  if (ta != device_type(b)) return false;
  return ta == aoti_torch_device_type_cpu() || a.get_device_index() == b.get_device_index();
}

namespace {

std::string shape_string(const std::vector<int64_t>& sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

std::string byte_count(const std::vector<int64_t>& sizes, ScalarType dtype) {
  int64_t n = 0;
  switch (dtype) {
    case ScalarType::Double:
    case ScalarType::Long: n = 8; break;
    case ScalarType::Float: n = 4; break;
    case ScalarType::Half:
    case ScalarType::BFloat16: n = 2; break;
    default: n = 1;
  }
  for (int64_t d : sizes) {
    if (d == 0) return "0 bytes";
  }
  for (int64_t d : sizes) {
    if (__builtin_mul_overflow(n, d, &n)) return "more than 2^63 bytes";
  }
  return std::to_string(n) + " bytes";
}

}  // namespace

Tensor empty_strided(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, ScalarType dtype,
                     const Tensor& like) {
  std::vector<int64_t> st = strides;
  if (st.empty()) {
    st.resize(sizes.size());
    int64_t s = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
      st[i] = s;
      s *= sizes[i] > 1 ? sizes[i] : 1;
    }
  }
  // aoti_torch_empty_strided: a plain C function (no dispatcher look-up by name per call), the
  // caching allocator of like's device.
  int32_t dev_index = 0;
  shim_check(aoti_torch_get_device_index(like.get(), &dev_index), "aoti_torch_get_device_index");
  AtenTensorHandle out = nullptr;
  if (aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), st.data(), shim_dtype(dtype),
                               device_type(like), dev_index, &out) != AOTI_TORCH_SUCCESS) {
    // torch's reason (out of memory, a size that overflows) stays behind the C shim: say what was
    // asked for, as ONNX Runtime does ("Failed to allocate memory for requested buffer of size N").
    throw std::runtime_error("opbridge: cannot allocate an output of shape " + shape_string(sizes) + " (" +
                             byte_count(sizes, dtype) + ") on " + device_string(like));
  }
  return Tensor(out);
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

Tensor to_cpu(const Tensor& t) {
  if (t.is_cpu()) return t;
  return torch::stable::to(t, torch::stable::Device(torch::headeronly::DeviceType::CPU));
}

std::vector<int64_t> channels_last_order(int64_t rank) {
  std::vector<int64_t> p{0};
  for (int64_t i = 2; i < rank; ++i) p.push_back(i);
  p.push_back(1);
  return p;
}

namespace {
// Whether t's strides are those of a contiguous tensor permuted by `order` (sizes-1 dims ignored,
// as torch's is_contiguous does).
bool permuted_contiguous(const Tensor& t, const std::vector<int64_t>& order) {
  const auto sz = t.sizes();
  const auto st = t.strides();
  int64_t expected = 1;
  for (size_t k = order.size(); k-- > 0;) {
    const int64_t d = order[k];
    if (sz[d] == 1) continue;
    if (st[d] != expected) return false;
    expected *= sz[d];
  }
  return true;
}
}  // namespace

bool uses_channels_last(const Tensor& x) {
  const int64_t rank = x.dim();
  if (rank < 3 || x.is_contiguous() || !permuted_contiguous(x, channels_last_order(rank))) return false;
  return x.size(0) != 1 || x.stride(0) >= x.numel();
}

Tensor empty_in_layout(const Tensor& x, bool channels_last) {
  return empty_in_layout(x, channels_last, torch_adapter::dtype(x));
}

Tensor empty_in_layout(const Tensor& x, bool channels_last, ScalarType dtype) {
  const auto sz = sizes(x);
  if (!channels_last) return torch_adapter::empty(sz, dtype, x);
  // The strides of a contiguous [N, *spatial, C] buffer, in x's dimension order.
  const auto order = channels_last_order(x.dim());
  std::vector<int64_t> st(sz.size());
  int64_t s = 1;
  for (size_t k = order.size(); k-- > 0;) {
    st[order[k]] = s;
    s *= sz[order[k]] > 1 ? sz[order[k]] : 1;
  }
  return empty_strided(sz, st, dtype, x);
}

Tensor in_layout(const Tensor& t, bool channels_last) {
  if (!channels_last) return torch_adapter::contiguous(t);
  if (permuted_contiguous(t, channels_last_order(t.dim()))) return t;
  Tensor out = empty_in_layout(t, true);
  torch::stable::copy_(out, t);
  return out;
}

ParallelFor torch_parallel() {
  struct Ctx {
    ParallelFor::Body body;
    void* body_ctx;
  };
  const ParallelFor::Runner run = [](void*, int64_t n, int64_t grain, ParallelFor::Body body, void* body_ctx) {
    Ctx ctx{body, body_ctx};
    const ParallelFunc fn = [](int64_t b, int64_t e, void* c) {
      const Ctx* x = static_cast<const Ctx*>(c);
      x->body(x->body_ctx, b, e);
    };
    shim_check(torch_parallel_for(0, n, grain, fn, &ctx), "torch_parallel_for");
  };
  return ParallelFor(run, nullptr);
}

void* current_cuda_stream(const Tensor& t) {
  using GetStream = AOTITorchError (*)(int32_t device_index, void** ret_stream);
  static const GetStream get = [] {
    // A C function of the shim: declared under USE_CUDA in torch's headers, defined in
    // libtorch_cuda, which torch loads with RTLD_LOCAL (so it is looked up there by name).
    constexpr const char* kName = "aoti_torch_get_current_cuda_stream";
    void* f = dlsym(RTLD_DEFAULT, kName);
    if (f == nullptr) {
      if (void* lib = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD)) f = dlsym(lib, kName);
    }
    return reinterpret_cast<GetStream>(f);
  }();
  if (get == nullptr) throw std::runtime_error("opbridge: this torch has no CUDA (aoti_torch_get_current_cuda_stream)");
  void* stream = nullptr;
  shim_check(get(t.get_device_index(), &stream), "aoti_torch_get_current_cuda_stream");
  return stream;
}

// ---------------------------------------------------------------- boxed stacks

Tensor BoxedArgs::tensor(uint64_t i) const { return torch::stable::detail::to<Tensor>(stack_[i]); }

std::optional<Tensor> BoxedArgs::optional_tensor(uint64_t i) const {
  return torch::stable::detail::to<std::optional<Tensor>>(stack_[i]);
}

const Tensor& undefined_tensor() {
  static const Tensor* t = new Tensor();  // never destroyed: may be used until exit
  return *t;
}

int64_t BoxedArgs::int64(uint64_t i) const { return torch::stable::detail::to<int64_t>(stack_[i]); }
double BoxedArgs::float64(uint64_t i) const { return torch::stable::detail::to<double>(stack_[i]); }
bool BoxedArgs::boolean(uint64_t i) const { return torch::stable::detail::to<bool>(stack_[i]); }

std::string BoxedArgs::string(uint64_t i) const {
  // By hand rather than to<std::string>, whose 2.13 form does not free the copy it makes.
  StringHandle h = torch::stable::detail::to<StringHandle>(stack_[i]);
  size_t n = 0;
  const char* data = nullptr;
  const bool ok = torch_string_length(h, &n) == AOTI_TORCH_SUCCESS && torch_string_c_str(h, &data) == AOTI_TORCH_SUCCESS;
  std::string s = ok ? std::string(data, n) : std::string();
  torch_delete_string(h);
  if (!ok) throw std::runtime_error("opbridge: could not read a string argument");
  return s;
}

std::vector<int64_t> BoxedArgs::int64_list(uint64_t i) const {
  return torch::stable::detail::to<std::vector<int64_t>>(stack_[i]);
}
std::vector<double> BoxedArgs::float64_list(uint64_t i) const {
  return torch::stable::detail::to<std::vector<double>>(stack_[i]);
}

void BoxedArgs::set(StableIValue* stack, uint64_t i, const Tensor& t) { stack[i] = torch::stable::detail::from(t); }

// ---------------------------------------------------------------- declared ops

namespace {

std::string float_literal(double v) {
  std::string s = shortest_double(v);
  if (s.find_first_of(".eE") == std::string::npos) s += ".";
  return s;
}

// A string literal of torch's schema lexer: quotes, backslashes, tabs and newlines escaped (a raw
// newline ends the literal there; the declaration refuses a NUL, which ends the whole schema).
std::string string_literal(const std::string& v) {
  std::string s = "\"";
  for (char c : v) {
    switch (c) {
      case '"': s += "\\\""; break;
      case '\\': s += "\\\\"; break;
      case '\n': s += "\\n"; break;
      case '\t': s += "\\t"; break;
      default: s += c;
    }
  }
  return s + "\"";
}

std::string default_literal(const ArgDecl& a) {
  const AttrValue& v = a.default_value;
  switch (a.attr_type) {
    case AttrType::kInt: return std::to_string(v.i);
    case AttrType::kBool: return v.i ? "True" : "False";
    case AttrType::kFloat: return float_literal(v.f);
    case AttrType::kString: return string_literal(v.s);
    case AttrType::kInts: {
      std::string s = "[";
      for (size_t i = 0; i < v.ints.size(); ++i) s += (i ? ", " : "") + std::to_string(v.ints[i]);
      return s + "]";
    }
    case AttrType::kFloats: {
      std::string s = "[";
      for (size_t i = 0; i < v.floats.size(); ++i) s += (i ? ", " : "") + float_literal(v.floats[i]);
      return s + "]";
    }
  }
  return "";
}

}  // namespace

std::string torch_schema(const OpDecl& decl) {
  std::string s = decl.name() + "(";
  bool first = true;
  for (const ArgDecl& a : decl.args()) {
    s += first ? "" : ", ";
    first = false;
    if (a.is_input) {
      s += a.optional ? "Tensor? " + a.name + "=None" : "Tensor " + a.name;
    } else {
      s += std::string(attr_type_key(a.attr_type)) + " " + a.name;
      if (a.has_default) s += "=" + default_literal(a);
    }
  }
  s += ") -> ";
  if (decl.outputs().size() == 1) return s + "Tensor";
  s += "(";
  for (size_t i = 0; i < decl.outputs().size(); ++i) s += i ? ", Tensor" : "Tensor";
  return s + ")";
}

TorchCall::TorchCall(const OpDecl& decl, std::string_view qualname, StableIValue* stack, uint64_t num_args)
    : decl_(&decl), qualname_(qualname), call_(decl) {
  const BoxedArgs args(stack, num_args);
  const auto& arg_decls = decl.args();
  if (num_args != arg_decls.size()) {
    throw_error(nullptr, qualname_, "expected " + std::to_string(arg_decls.size()) + " arguments, got " +
                                        std::to_string(num_args));
  }
  inputs_.resize(decl.inputs().size());
  host_.resize(decl.inputs().size());
  // Take every argument over first (each is an owning reference), then check.
  for (uint64_t k = 0; k < num_args; ++k) {
    const ArgDecl& a = arg_decls[k];
    if (a.is_input) {
      auto& slot = inputs_[static_cast<size_t>(a.input_index)];
      if (a.optional) {
        slot = args.optional_tensor(k);
      } else {
        slot.emplace(args.tensor(k));
      }
      continue;
    }
    AttrValue& v = call_.attr(static_cast<size_t>(a.attr_index));
    v.type = a.attr_type;
    switch (a.attr_type) {
      case AttrType::kInt: v.i = args.int64(k); break;
      case AttrType::kBool: v.i = args.boolean(k) ? 1 : 0; break;
      case AttrType::kFloat: v.f = float_attribute(args.float64(k)); break;
      case AttrType::kString: v.s = args.string(k); break;
      case AttrType::kInts: v.ints = args.int64_list(k); break;
      case AttrType::kFloats:
        v.floats = args.float64_list(k);
        for (double& f : v.floats) f = float_attribute(f);
        break;
    }
  }
  const Tensor* first = nullptr;
  const ArgDecl* first_decl = nullptr;
  for (const ArgDecl* a : decl.check_order()) {
    const size_t i = static_cast<size_t>(a->input_index);
    if (!inputs_[i].has_value()) continue;
    const Tensor& t = *inputs_[i];
    TensorArg& arg = call_.input(i);
    arg.present = true;
    const ScalarType type = torch_adapter::dtype(t);
    arg.type = elem_type(type);
    const auto sz = t.sizes();
    arg.shape.assign(sz.begin(), sz.end());
    if (a->host_memory) {
      // Validation reads these values: a contiguous CPU copy (one sync for a device tensor).
      host_[i] = torch_adapter::contiguous(to_cpu(t));
      if (type == ScalarType::Long) arg.data = host_[i]->data_ptr();
      continue;
    }
    if (first == nullptr) {
      first = &t;
      first_decl = a;
    } else if (!same_device(t, *first)) {
      throw_error(kValueErrorTag, qualname_,
                  a->name + " must be on " + first_decl->name + "'s device (" + device_string(*first) + "), got " +
                      device_string(t));
    }
  }
  anchor_ = first;
  check_status(opbridge::check_call(call_), qualname_);
  outputs_.resize(decl.outputs().size());
}

const Tensor& TorchCall::input(size_t i) const {
  const auto& t = inputs_.at(i);
  return t.has_value() ? *t : undefined_tensor();
}

const Tensor& TorchCall::host(std::string_view name) const {
  const int64_t i = decl_->input_index(name);
  if (i < 0 || !host_[static_cast<size_t>(i)].has_value()) {
    throw std::runtime_error(std::string(qualname_) + ": no host_memory input named " + std::string(name));
  }
  return *host_[static_cast<size_t>(i)];
}

void TorchCall::set_output(size_t i, Tensor t) { outputs_.at(i) = std::move(t); }

void TorchCall::box_outputs(StableIValue* stack, uint64_t num_outputs) const {
  if (num_outputs != outputs_.size()) {
    throw_error(nullptr, qualname_, "the schema has " + std::to_string(num_outputs) + " outputs, the declaration " +
                                        std::to_string(outputs_.size()));
  }
  for (size_t i = 0; i < outputs_.size(); ++i) {
    if (!outputs_[i].has_value()) throw_error(nullptr, qualname_, "the kernel set no output " + std::to_string(i));
    BoxedArgs::set(stack, i, *outputs_[i]);
  }
}

}  // namespace opbridge::torch_adapter
