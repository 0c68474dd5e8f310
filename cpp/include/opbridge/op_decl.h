// opbridge op declarations: the one contract of an op, written once, from which every adapter
// derives what it needs.
//
// An op's declaration names it (snake_case for torch, PascalCase for ONNX), lists its arguments
// in torch order (tensor inputs and attributes interleaved, as the torch schema has them), the
// element types each input accepts, the output rule, the op version each argument exists since,
// and one validation routine. From it come:
//   - the torch schema and the checks of the torch kernel (torch_common.h: LibraryOps, check_call),
//   - the ORT registration for CPU and CUDA: element types, optional and host-memory inputs,
//     typed attributes with defaults, the opset range, shape inference (ort_op.h),
//   - everything Python needs, through opbridge's C ABI (opbridge/c_abi.h: OpbridgeDescribeOps,
//     OpbridgeCheckCall): the onnx OpSchemas, the fake kernels, both exporters' rules,
//     `opbridge check`, and the check for unknown attribute names.
// The same checks therefore give the same verdict and message in torch, its fake kernel, ORT's
// shape inference and ORT's kernels.
//
//   OpDecl group_norm_decl() {
//     return OpDecl("group_norm", "GroupNorm", 1)
//         .input("x", "T").shape("(N, C, *)").min_rank(2)
//         .attr_int("num_groups").required()
//         .input("weight", "T").optional().onnx_name("scale").shape("(C,)")
//         .attr_float("eps", 1e-5).onnx_name("epsilon")
//         .attr_string("activation", "none").choices({"none", "silu"}).since(2)
//         .types("T", kFloatTypes)
//         .output("y", "T", "x")
//         .check(group_norm_validate);
//   }
//
// Framework-free: no torch, no ORT, no Python.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "opbridge/dtype.h"
#include "opbridge/status.h"

namespace opbridge {

// ONNX element types (TensorProto.DataType numbers), as ORT and onnx number them.
enum class ElemType : int32_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUint8 = 2,
  kInt8 = 3,
  kUint16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kUint32 = 12,
  kUint64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBFloat16 = 16,
};
// "float32", "int64", ... ("undefined" for anything else).
const char* elem_type_name(ElemType t);

// The floating types every opbridge kernel supports, and the usual subsets. Constant arrays, not
// vectors: a header variable with a dynamic initializer puts that initializer (and the vector code
// it calls, a shared COMDAT) into every file that includes it, the per-ISA kernel files too, and
// whichever copy the linker keeps or runs first would execute AVX code at load time on any CPU.
inline constexpr std::array<ElemType, 4> kFloatTypes = {ElemType::kFloat32, ElemType::kFloat64, ElemType::kFloat16,
                                                        ElemType::kBFloat16};
inline constexpr std::array<ElemType, 2> kFloat32And64 = {ElemType::kFloat32, ElemType::kFloat64};

// The ElemType of a kernel element type: float, double, Half, BFloat16.
template <class T> constexpr ElemType elem_type_of();
template <> constexpr ElemType elem_type_of<float>() { return ElemType::kFloat32; }
template <> constexpr ElemType elem_type_of<double>() { return ElemType::kFloat64; }
template <> constexpr ElemType elem_type_of<Half>() { return ElemType::kFloat16; }
template <> constexpr ElemType elem_type_of<BFloat16>() { return ElemType::kBFloat16; }
template <> constexpr ElemType elem_type_of<int64_t>() { return ElemType::kInt64; }
template <> constexpr ElemType elem_type_of<int32_t>() { return ElemType::kInt32; }

// Runs the kernel instantiation for element type `t` among Ts, in adapters (torch and ORT alike):
//   return dispatch<float, double>(call.in("x").type, [&](auto tag) {
//     using T = decltype(tag);
//     return my_op_cpu<T>(...);   // a Status
//   });
// Only the listed types are instantiated (kernels need not exist for others); a type not among
// them is a TypeError (the declaration's types normally keep it out before this runs).
template <class... Ts, class F>
Status dispatch(ElemType t, F&& f) {
  Status result = Status::TypeError(std::string("unsupported element type ") + elem_type_name(t));
  (void)((t == elem_type_of<Ts>() ? (result = f(Ts{}), true) : false) || ...);
  return result;
}

enum class AttrType : int32_t { kInt = 0, kFloat = 1, kString = 2, kBool = 3, kInts = 4, kFloats = 5 };
const char* attr_type_name(AttrType t);  // "an int", "a float", "a string", ...
// The torch schema's spelling of an attribute type ("int", "float", "str", "bool", "int[]",
// "float[]"); also the type's key in the JSON description.
const char* attr_type_key(AttrType t);
// The shortest decimal form that reads back as exactly `v` ("1e-05", "0.5").
std::string shortest_double(double v);

// The value a float attribute has in every call: its float32 rounding, as ONNX stores float
// attributes (beyond float32's range: +-inf, NaN stays NaN). Torch, its fake kernel, ONNX Runtime
// and opbridge._core all round so, so that an op decides alike in each at a boundary (radius=0.3
// is 0.30000001192092896 everywhere, eps=1e-5 is float32(1e-5) in torch as in an exported model).
double float_attribute(double v);

// An attribute value (the member its type names is meaningful).
struct AttrValue {
  AttrType type = AttrType::kInt;
  int64_t i = 0;  // kInt, kBool
  double f = 0;   // kFloat
  std::string s;  // kString
  std::vector<int64_t> ints;
  std::vector<double> floats;
};

// What a validation routine sees of one tensor input. Sizes may be unknown (-1): in ORT's shape
// inference and the torch fake kernel under symbolic shapes. Checks on an unknown size are skipped
// there and run again, with every size known, in the kernels.
struct TensorArg {
  bool present = false;  // false for an omitted optional input
  ElemType type = ElemType::kUndefined;
  bool rank_known = true;
  std::vector<int64_t> shape;  // -1 where unknown
  // Host data of an input declared host_memory(), when the caller has it (kernels); nullptr in
  // shape inference and fake kernels, where checks on values are skipped.
  const void* data = nullptr;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  // Size of dimension i (negative i counts from the end); -1 when unknown.
  int64_t dim(int64_t i) const;
  bool known(int64_t i) const { return dim(i) >= 0; }
  bool all_known() const;
  // Number of elements; -1 when a size is unknown or the product overflows int64.
  int64_t numel() const;
  const int64_t* int64_data() const {
    return type == ElemType::kInt64 ? static_cast<const int64_t*>(data) : nullptr;
  }
};

class OpDecl;

// One call of an op as the validation routine sees it: inputs and attribute values (defaults
// applied) in declaration order, looked up by torch name.
class OpCall {
 public:
  explicit OpCall(const OpDecl& decl);
  const OpDecl& decl() const { return *decl_; }

  const TensorArg& in(std::string_view name) const;
  TensorArg& in(std::string_view name);
  const TensorArg& input(size_t i) const { return inputs_.at(i); }
  TensorArg& input(size_t i) { return inputs_.at(i); }
  size_t input_count() const { return inputs_.size(); }

  int64_t attr_int(std::string_view name) const;
  double attr_float(std::string_view name) const;
  bool attr_bool(std::string_view name) const;
  const std::string& attr_string(std::string_view name) const;
  const std::vector<int64_t>& attr_ints(std::string_view name) const;
  const std::vector<double>& attr_floats(std::string_view name) const;
  // Setting attributes by torch name (for adapters that build a call by hand).
  void set_int(std::string_view name, int64_t v);
  void set_float(std::string_view name, double v);
  void set_string(std::string_view name, std::string v);
  const AttrValue& attr(size_t i) const { return attrs_.at(i); }
  AttrValue& attr(size_t i) { return attrs_.at(i); }
  size_t attr_count() const { return attrs_.size(); }

 private:
  const AttrValue& attr_named(std::string_view name, AttrType type) const;
  const OpDecl* decl_;
  std::vector<TensorArg> inputs_;
  std::vector<AttrValue> attrs_;
};

using ValidateFn = Status (*)(const OpCall& call);
// Output `output`'s shape for a call that passed the checks, -1 where a size is unknown (shape
// inference: some input sizes may be unknown) or decided by the input values.
using OutputShapeFn = std::vector<int64_t> (*)(const OpCall& call, size_t output);

// One argument of the torch schema: a tensor input or an attribute.
struct ArgDecl {
  bool is_input = true;
  std::string name;       // torch argument name
  std::string onnx_name;  // ONNX input / attribute name
  std::string doc;
  int since = 0;  // op version the argument exists since (0: the op's first)
  // inputs
  std::string type_var;
  bool optional = false;
  int64_t rank = -1;      // exact rank, or -1
  int64_t min_rank = -1;  // minimum rank, or -1
  std::string shape_doc;  // e.g. "(N, C, *)": named in messages
  bool host_memory = false;
  // attributes
  AttrType attr_type = AttrType::kInt;
  bool required = false;
  bool has_default = false;
  AttrValue default_value;
  std::vector<std::string> choices;  // allowed values of a string attribute (empty: any)
  int64_t input_index = -1;  // position among inputs / attributes
  int64_t attr_index = -1;
  // Of a backward op (gradient_of()): an input that is the gradient of a forward output, not one
  // of the forward's arguments.
  bool gradient = false;
  // Of a backward op (gradient_of()): the index of the forward output this input is (an input
  // named like that output: autograd saves it from the forward), or -1.
  int64_t forward_output = -1;
};

struct TypeVarDecl {
  std::string name;
  std::vector<ElemType> types;
};

// Output shape rule: "x" (the shape of input x), or one expression per dimension, comma separated:
// non-negative integers, input[dim] (negative dim: from the end), int attributes by name,
// + - * // % (floor division and modulo, as in Python) and parentheses, e.g.
// "num_segments, values[1]", "x[0], x[1] * r * r, x[2] // stride". A size that comes out negative
// is an error of the call (check_call); a rule that does not parse is an error of the declaration.
// A dimension "?" depends on the input values: the kernel sizes that output itself (a compute
// function: KernelCall::out<T>(i, shape)), torch's fake kernel gives it a new unbacked size
// (new_dynamic_size()), ONNX shape inference leaves it symbolic.
struct DimTerm {  // one step of a dimension's expression, in postfix order
  enum Kind : int32_t {
    kConst = 0, kInputDim = 1, kAttr = 2, kAdd = 3, kSub = 4, kMul = 5, kFloorDiv = 6, kMod = 7, kDynamic = 8
  };
  Kind kind = kConst;
  int64_t a = 0;  // kConst: the value; kInputDim: the input index; kAttr: the attribute index
  int64_t b = 0;  // kInputDim: the dimension (negative: from the end)
};
struct OutputDecl {
  std::string name;
  std::string type_var;
  std::string rule;
  std::string doc;
  int64_t like_input = -1;                    // rule "x": the index of x
  std::vector<std::vector<DimTerm>> dims;     // rule with dimensions: one postfix expression per dimension
  bool keeps_memory_format = false;           // torch: channels_last in -> channels_last out
  // Whether the output has a gradient: false for integer and bool outputs (always) and for those
  // declared not_differentiable(). A backward op takes gradients of the differentiable ones only.
  bool differentiable = true;
  bool declared_not_differentiable = false;   // not_differentiable() on a floating output
};

class OpDecl {
 public:
  OpDecl() = default;
  // name: snake_case (torch op and lowering key); onnx_type: PascalCase ONNX op type;
  // since: the op version (opset version of the library's domain) the op first appears in.
  OpDecl(std::string name, std::string onnx_type, int since = 1);

  // ---- building (each modifier applies to the argument declared last) ----
  OpDecl& doc(std::string text);
  OpDecl& input(std::string name, std::string type_var, std::string doc = "");
  OpDecl& attr_int(std::string name, std::string doc = "");
  OpDecl& attr_int(std::string name, int64_t default_value, std::string doc = "");
  OpDecl& attr_float(std::string name, double default_value, std::string doc = "");
  OpDecl& attr_float(std::string name, std::string doc = "");
  OpDecl& attr_bool(std::string name, bool default_value, std::string doc = "");
  OpDecl& attr_string(std::string name, std::string default_value, std::string doc = "");
  OpDecl& attr_ints(std::string name, std::vector<int64_t> default_value, std::string doc = "");
  OpDecl& attr_floats(std::string name, std::vector<double> default_value, std::string doc = "");
  // A default of another type does not compile, rather than converting silently (attr_int("k",
  // 2.5) would be 2, attr_bool("flag", "no") true, attr_string("mode", 0) a null pointer).
  template <class V, std::enable_if_t<std::is_floating_point_v<V> || std::is_same_v<V, bool>, int> = 0>
  OpDecl& attr_int(std::string name, V default_value, std::string doc = "") = delete;
  template <class V, std::enable_if_t<!std::is_same_v<V, bool>, int> = 0>
  OpDecl& attr_bool(std::string name, V default_value, std::string doc = "") = delete;
  template <class V, std::enable_if_t<std::is_arithmetic_v<V>, int> = 0>
  OpDecl& attr_string(std::string name, V default_value, std::string doc = "") = delete;
  OpDecl& optional();                      // input may be omitted (torch: Tensor? = None)
  OpDecl& required();                      // attribute without default
  OpDecl& onnx_name(std::string name);     // ONNX name differs from the torch name
  OpDecl& shape(std::string shape_doc);    // how messages describe the input, e.g. "(N, C, *)"
  OpDecl& rank(int64_t r);                 // input must have exactly this rank
  OpDecl& min_rank(int64_t r);             // ... at least this rank
  OpDecl& host_memory();                   // input values are read on the host (int64 index data)
  OpDecl& choices(std::vector<std::string> values);  // string attribute: allowed values
  OpDecl& since(int version);              // argument added in this op version
  OpDecl& types(std::string type_var, std::vector<ElemType> types);
  template <std::size_t N>
  OpDecl& types(std::string type_var, const std::array<ElemType, N>& list) {
    return types(std::move(type_var), std::vector<ElemType>(list.begin(), list.end()));
  }
  OpDecl& output(std::string name, std::string type_var, std::string rule, std::string doc = "");
  OpDecl& keeps_memory_format();           // last output: torch keeps x's memory format
  // Last output: no gradient flows through it (a mask, a count as float). Integer and bool
  // outputs never have one; autograd treats such outputs as constants, and a backward op declared
  // with gradient_of() takes no gradient for them.
  OpDecl& not_differentiable();
  OpDecl& check(ValidateFn fn);            // the op's own validation (after the generic checks)
  // Output shapes a rule cannot describe: fn replaces the rules in output_shape() (kernels'
  // ctx.output(index), ORT's shape inference). Python's fake kernel and ONNX inference take
  // opbridge.ops.register_fake / opbridge.onnx.register_shape_inference.
  OpDecl& output_shape_fn(OutputShapeFn fn);
  // Every argument of `forward`, in its order, with its types (a backward op takes them all, so
  // an argument added to the forward reaches the backward without another edit). `forward`'s
  // checks then run on them before this op's own, in every adapter: a backward op's kernel never
  // sees arguments its forward would refuse.
  OpDecl& args_of(const OpDecl& forward);
  // This op is the backward of `forward`: its inputs other than forward's arguments are the
  // gradients of forward's differentiable outputs (in order), except an input named like one of
  // forward's outputs, which is that output (autograd saves it, so the backward recomputes
  // nothing: an argmax, a mean); its outputs are the gradients of forward's inputs named in `wrt`
  // (in order). Autograd is derived from it (opbridge.ops registers forward's
  // backward from this op), and the checks take a forward argument, not a gradient, as the
  // reference for dtypes and devices ("grad must have the dtype of x"). It must take every
  // argument of `forward` (args_of()), whose checks run on them as with args_of().
  OpDecl& gradient_of(const OpDecl& forward, std::vector<std::string> wrt);

  // ---- reading ----
  const std::string& name() const { return name_; }
  const std::string& onnx_type() const { return onnx_type_; }
  const std::string& description() const { return doc_; }
  int since_version() const { return since_; }
  int latest_version() const;  // highest `since` of the op and its arguments
  const std::vector<ArgDecl>& args() const { return args_; }
  // the tensor inputs, in order
  const std::vector<const ArgDecl*>& inputs() const {
    finish();
    return derived_.inputs;
  }
  // the attributes, in order
  const std::vector<const ArgDecl*>& attrs() const {
    finish();
    return derived_.attrs;
  }
  const std::vector<OutputDecl>& outputs() const {
    finish();  // the output rules are read at the end of the declaration
    return outputs_;
  }
  const std::vector<TypeVarDecl>& type_vars() const { return type_vars_; }
  const TypeVarDecl* type_var(std::string_view name) const;
  int64_t input_index(std::string_view name) const;  // -1 when unknown
  int64_t attr_index(std::string_view name) const;
  ValidateFn validate_fn() const { return validate_; }
  OutputShapeFn output_shape_function() const { return output_shape_; }
  // The forward op of a backward op (nullptr for others), and the inputs whose gradients it gives.
  const OpDecl* gradient_of() const { return gradient_of_; }
  // The op whose checks run on this op's arguments before its own (check_call): gradient_of()'s
  // forward, else the op args_of() took the arguments of; nullptr for others.
  const OpDecl* forward() const { return gradient_of_ != nullptr ? gradient_of_ : args_of_; }
  const std::vector<std::string>& gradient_wrt() const { return gradient_wrt_; }
  // The inputs in the order checks compare them: forward arguments before gradients (for most
  // ops simply inputs()).
  const std::vector<const ArgDecl*>& check_order() const {
    finish();
    return derived_.check_order;
  }

  // Empty when the declaration is consistent, else what is wrong with it ("op group_norm:
  // argument eps: ..."). A misdeclared op is refused with this message: the build's check
  // (opbridge_add_op) fails, torch and ONNX Runtime leave it out of the library (its other ops
  // load), Python raises MisdeclaredOpError. It covers every schema torch's parser would refuse.
  const std::string& error() const;

 private:
  ArgDecl& last(const char* what);
  ArgDecl& add(ArgDecl a);
  // Derives what the declaration implies, once (inline: the readers above call it on every call).
  void finish() const {
    if (!derived_.finished) finish_declaration();
  }
  void finish_declaration() const;

  std::string name_, onnx_type_, doc_;
  int since_ = 1;
  std::vector<ArgDecl> args_;
  std::vector<TypeVarDecl> type_vars_;
  std::vector<OutputDecl> outputs_;
  ValidateFn validate_ = nullptr;
  OutputShapeFn output_shape_ = nullptr;
  const OpDecl* gradient_of_ = nullptr;
  const OpDecl* args_of_ = nullptr;
  std::vector<std::string> gradient_wrt_;
  std::vector<std::string> build_errors_;
  // Derived from the above by finish(); pointers into args_, so a copy starts afresh.
  struct Derived {
    std::vector<const ArgDecl*> inputs, attrs, check_order;
    std::string error;
    bool finished = false;
    Derived() = default;
    Derived(const Derived&) {}
    Derived& operator=(const Derived&) {
      *this = Derived();
      return *this;
    }
  };
  mutable Derived derived_;
  friend class OpCall;
};

// Generic checks from the declaration (required inputs present, element types allowed and
// consistent per type variable, ranks, string choices), then the op's own validation. For an op
// with a forward() (a backward op), first every check of the forward on the forward's arguments
// (check_call of forward_call(call)), and for a gradient_of() op, after its own validation, each
// gradient input against the shape its forward output has.
// The message of an error is the part after the op label ("x must have rank >= 2 ...").
Status check_call(const OpCall& call);
// The call of the forward (forward()) that a backward op's call holds: the forward's arguments, by name.
OpCall forward_call(const OpCall& backward);
// For an op's check(): every value of the int64 input `name` lies in [lo, hi), where its values
// are known (a host_memory() input, in the kernels; shape inference and fake kernels skip it), else
// "segment_ids[3] = 99 is outside [0, 3)" (the index counts elements in row-major order).
Status check_index_values(const OpCall& call, std::string_view name, int64_t lo, int64_t hi);
// The checks of check_call that need only attribute values (string choices): ORT runs them when
// it creates a kernel, so a bad value fails session creation, naming the node.
Status check_attributes(const OpCall& call);

// The output shapes a call produces, -1 where unknown (valid after check_call succeeded).
std::vector<int64_t> output_shape(const OpCall& call, size_t output);
// One dimension of an output rule evaluated on a call: its size, -1 where an input size it reads
// is unknown. Sets *error (when not null) for a result that is negative, a division by zero or an
// int64 overflow.
int64_t eval_dim(const OpCall& call, const std::vector<DimTerm>& expr, std::string* error = nullptr);
// Empty where output `output`'s shape is known for a checked call; else why an adapter cannot
// allocate it before the kernel runs (a "?" dimension: the kernel sizes that output itself).
std::string unsized_output(const OpCall& call, size_t output, const std::vector<int64_t>& shape);
// Whether output `output`'s rule has a "?" dimension (its kernel sizes it: KernelCall::out(i, shape)).
bool sized_by_kernel(const OpDecl& decl, size_t output);
// Empty where `shape`, the shape a kernel gives output `output` (sized_by_kernel), agrees with the
// rule's rank and the sizes the rule knows (`known`: output_shape(call, output)); else why not.
std::string check_kernel_shape(const OpDecl& decl, size_t output, const std::vector<int64_t>& known,
                               const std::vector<int64_t>& shape);
// The element type of output `output`: that of the inputs bound to its type variable.
ElemType output_type(const OpCall& call, size_t output);

// The op version a call needs: the op's first version, raised by every argument of a later
// version whose value differs from its default (or that is present, for an optional input).
int required_version(const OpCall& call);

// Every op of a library, in registration order, with a JSON description for Python
// (OpbridgeDescribeOps). Libraries register their ops through their adapters (ORT, torch).
std::string describe_ops_json(const std::vector<const OpDecl*>& ops, const std::string& domain, int domain_version);

}  // namespace opbridge
