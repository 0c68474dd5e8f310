// opbridge op declarations: building, generic checks, output rules, JSON description.
#include "opbridge/op_decl.h"

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <sstream>

namespace opbridge {

const char* elem_type_name(ElemType t) {
  switch (t) {
    case ElemType::kFloat32: return "float32";
    case ElemType::kFloat64: return "float64";
    case ElemType::kFloat16: return "float16";
    case ElemType::kBFloat16: return "bfloat16";
    case ElemType::kUint8: return "uint8";
    case ElemType::kInt8: return "int8";
    case ElemType::kInt32: return "int32";
    case ElemType::kInt64: return "int64";
    case ElemType::kBool: return "bool";
    case ElemType::kUint16: return "uint16";
    case ElemType::kInt16: return "int16";
    case ElemType::kUint32: return "uint32";
    case ElemType::kUint64: return "uint64";
    case ElemType::kComplex64: return "complex64";
    case ElemType::kComplex128: return "complex128";
    case ElemType::kUndefined: break;
  }
  return "undefined";
}

const char* attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::kInt: return "an int";
    case AttrType::kFloat: return "a float";
    case AttrType::kString: return "a string";
    case AttrType::kBool: return "a bool";
    case AttrType::kInts: return "a list of ints";
    case AttrType::kFloats: return "a list of floats";
  }
  return "an attribute";
}

// ---------------------------------------------------------------- TensorArg

int64_t TensorArg::dim(int64_t i) const {
  const int64_t r = rank();
  if (!rank_known) return -1;
  if (i < 0) i += r;
  if (i < 0 || i >= r) return -1;
  return shape[static_cast<size_t>(i)] < 0 ? -1 : shape[static_cast<size_t>(i)];
}

bool TensorArg::all_known() const {
  if (!rank_known) return false;
  for (int64_t d : shape) {
    if (d < 0) return false;
  }
  return true;
}

int64_t TensorArg::numel() const {
  if (!all_known()) return -1;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

// ---------------------------------------------------------------- OpDecl building

OpDecl::OpDecl(std::string name, std::string onnx_type, int since)
    : name_(std::move(name)), onnx_type_(std::move(onnx_type)), since_(since) {}

OpDecl& OpDecl::doc(std::string text) {
  // Before any argument: the op's description; after one: that argument's.
  if (args_.empty()) {
    doc_ = std::move(text);
  } else {
    last("doc").doc = std::move(text);
  }
  return *this;
}

ArgDecl& OpDecl::add(ArgDecl a) {
  derived_.finished = false;
  if (a.onnx_name.empty()) a.onnx_name = a.name;
  args_.push_back(std::move(a));
  return args_.back();
}

ArgDecl& OpDecl::last(const char* what) {
  if (args_.empty()) {
    build_errors_.push_back(std::string(what) + "() before any argument was declared");
    static ArgDecl dummy;
    dummy = ArgDecl{};
    return dummy;
  }
  derived_.finished = false;
  return args_.back();
}

OpDecl& OpDecl::input(std::string name, std::string type_var, std::string doc) {
  ArgDecl a;
  a.is_input = true;
  a.name = std::move(name);
  a.type_var = std::move(type_var);
  a.doc = std::move(doc);
  add(std::move(a));
  return *this;
}

namespace {
ArgDecl attribute(std::string name, AttrType type, std::string doc) {
  ArgDecl a;
  a.is_input = false;
  a.name = std::move(name);
  a.attr_type = type;
  a.doc = std::move(doc);
  a.default_value.type = type;
  return a;
}
}  // namespace

OpDecl& OpDecl::attr_int(std::string name, std::string doc) {
  add(attribute(std::move(name), AttrType::kInt, std::move(doc)));
  return *this;
}
OpDecl& OpDecl::attr_int(std::string name, int64_t value, std::string doc) {
  ArgDecl& a = add(attribute(std::move(name), AttrType::kInt, std::move(doc)));
  a.has_default = true;
  a.default_value.i = value;
  return *this;
}
OpDecl& OpDecl::attr_float(std::string name, double value, std::string doc) {
  ArgDecl& a = add(attribute(std::move(name), AttrType::kFloat, std::move(doc)));
  a.has_default = true;
  a.default_value.f = value;
  return *this;
}
OpDecl& OpDecl::attr_float(std::string name, std::string doc) {
  add(attribute(std::move(name), AttrType::kFloat, std::move(doc)));
  return *this;
}
OpDecl& OpDecl::attr_bool(std::string name, bool value, std::string doc) {
  ArgDecl& a = add(attribute(std::move(name), AttrType::kBool, std::move(doc)));
  a.has_default = true;
  a.default_value.i = value ? 1 : 0;
  return *this;
}
OpDecl& OpDecl::attr_string(std::string name, std::string value, std::string doc) {
  ArgDecl& a = add(attribute(std::move(name), AttrType::kString, std::move(doc)));
  a.has_default = true;
  a.default_value.s = std::move(value);
  return *this;
}
OpDecl& OpDecl::attr_ints(std::string name, std::vector<int64_t> value, std::string doc) {
  ArgDecl& a = add(attribute(std::move(name), AttrType::kInts, std::move(doc)));
  a.has_default = true;
  a.default_value.ints = std::move(value);
  return *this;
}
OpDecl& OpDecl::attr_floats(std::string name, std::vector<double> value, std::string doc) {
  ArgDecl& a = add(attribute(std::move(name), AttrType::kFloats, std::move(doc)));
  a.has_default = true;
  a.default_value.floats = std::move(value);
  return *this;
}

OpDecl& OpDecl::optional() {
  ArgDecl& a = last("optional");
  if (!a.is_input) build_errors_.push_back("argument " + a.name + ": optional() applies to inputs; give an attribute a default");
  a.optional = true;
  return *this;
}
OpDecl& OpDecl::required() {
  ArgDecl& a = last("required");
  if (a.is_input) build_errors_.push_back("argument " + a.name + ": required() applies to attributes (inputs are required unless optional())");
  a.required = true;
  a.has_default = false;
  return *this;
}
OpDecl& OpDecl::onnx_name(std::string n) {
  last("onnx_name").onnx_name = std::move(n);
  return *this;
}
OpDecl& OpDecl::shape(std::string s) {
  last("shape").shape_doc = std::move(s);
  return *this;
}
OpDecl& OpDecl::rank(int64_t r) {
  last("rank").rank = r;
  return *this;
}
OpDecl& OpDecl::min_rank(int64_t r) {
  last("min_rank").min_rank = r;
  return *this;
}
OpDecl& OpDecl::host_memory() {
  last("host_memory").host_memory = true;
  return *this;
}
OpDecl& OpDecl::choices(std::vector<std::string> values) {
  ArgDecl& a = last("choices");
  if (a.is_input || a.attr_type != AttrType::kString) {
    build_errors_.push_back("argument " + a.name + ": choices() applies to string attributes");
  }
  a.choices = std::move(values);
  return *this;
}
OpDecl& OpDecl::since(int version) {
  last("since").since = version;
  return *this;
}
OpDecl& OpDecl::types(std::string type_var, std::vector<ElemType> types) {
  derived_.finished = false;
  type_vars_.push_back({std::move(type_var), std::move(types)});
  return *this;
}
OpDecl& OpDecl::output(std::string name, std::string type_var, std::string rule, std::string doc) {
  derived_.finished = false;
  OutputDecl o;
  o.name = std::move(name);
  o.type_var = std::move(type_var);
  o.rule = std::move(rule);
  o.doc = std::move(doc);
  outputs_.push_back(std::move(o));
  return *this;
}
OpDecl& OpDecl::not_differentiable() {
  derived_.finished = false;
  if (outputs_.empty()) {
    build_errors_.push_back("not_differentiable() before any output was declared");
  } else {
    outputs_.back().declared_not_differentiable = true;
  }
  return *this;
}
OpDecl& OpDecl::keeps_memory_format() {
  if (outputs_.empty()) {
    build_errors_.push_back("keeps_memory_format() before any output was declared");
  } else {
    outputs_.back().keeps_memory_format = true;
  }
  return *this;
}
OpDecl& OpDecl::output_shape_fn(OutputShapeFn fn) {
  output_shape_ = fn;
  return *this;
}

OpDecl& OpDecl::check(ValidateFn fn) {
  validate_ = fn;
  return *this;
}
OpDecl& OpDecl::args_of(const OpDecl& forward) {
  if (!forward.error().empty()) build_errors_.push_back("args_of(" + forward.name() + "): " + forward.error());
  if (args_of_ != nullptr && args_of_ != &forward) {
    build_errors_.push_back("args_of(" + forward.name() + "): the op takes the arguments of " + args_of_->name() +
                            " already (its checks run on them; an op has one forward)");
  }
  args_of_ = &forward;
  for (const ArgDecl& a : forward.args()) {
    ArgDecl copy = a;
    copy.input_index = copy.attr_index = -1;
    copy.gradient = false;
    add(std::move(copy));
  }
  for (const TypeVarDecl& t : forward.type_vars()) {
    if (type_var(t.name) == nullptr) types(t.name, t.types);
  }
  return *this;
}
OpDecl& OpDecl::gradient_of(const OpDecl& forward, std::vector<std::string> wrt) {
  derived_.finished = false;
  gradient_of_ = &forward;
  gradient_wrt_ = std::move(wrt);
  return *this;
}

namespace {
bool is_floating(ElemType t) {
  return t == ElemType::kFloat32 || t == ElemType::kFloat64 || t == ElemType::kFloat16 || t == ElemType::kBFloat16;
}
}  // namespace

// ---------------------------------------------------------------- OpDecl reading

int OpDecl::latest_version() const {
  int v = since_;
  for (const ArgDecl& a : args_) v = std::max(v, a.since);
  return v;
}

const TypeVarDecl* OpDecl::type_var(std::string_view n) const {
  for (const TypeVarDecl& t : type_vars_) {
    if (t.name == n) return &t;
  }
  return nullptr;
}

int64_t OpDecl::input_index(std::string_view n) const {
  finish();
  for (size_t i = 0; i < derived_.inputs.size(); ++i) {
    if (derived_.inputs[i]->name == n) return static_cast<int64_t>(i);
  }
  return -1;
}

int64_t OpDecl::attr_index(std::string_view n) const {
  finish();
  for (size_t i = 0; i < derived_.attrs.size(); ++i) {
    if (derived_.attrs[i]->name == n) return static_cast<int64_t>(i);
  }
  return -1;
}

namespace {

bool valid_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

// Words that cannot name an op or an argument: torch's schema lexer reads them as keywords
// ("expected ident but found 'in'"), and Python's as keywords too (the ops' signatures there).
bool reserved_word(const std::string& s) {
  static const char* const kWords[] = {
      // torch (torch/csrc/jit/frontend/lexer.h) and Python alike
      "False", "None", "True", "and", "as", "assert", "break", "class", "continue", "def", "del", "elif", "else",
      "for", "global", "if", "import", "in", "is", "not", "or", "pass", "raise", "return", "while", "with",
      // torch only
      "Ellipsis", "NoneType",
      // Python only
      "async", "await", "except", "finally", "from", "lambda", "nonlocal", "try", "yield"};
  for (const char* w : kWords) {
    if (s == w) return true;
  }
  return false;
}

// Why `s` cannot be a string value of a declaration (empty: it can). torch's schemas and ONNX
// Runtime's string attributes are C strings, which a NUL ends (in a schema, mid-literal: torch
// refuses it), and Python reads schemas as UTF-8. (The schema's literal escapes quotes,
// backslashes and newlines: torch_schema.)
std::string unwritable_string(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == 0) {
      return "holds a NUL character at position " + std::to_string(i) +
             " (torch's schemas and ONNX Runtime's attributes would end there)";
    }
    // One UTF-8 sequence: its length from the lead byte, then continuation bytes 10xxxxxx.
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = n != 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (!ok) return "is not valid UTF-8 (byte " + std::to_string(i) + ")";
    i += n;
  }
  return {};
}

// Why a float default cannot be written into a torch schema (empty: it can). torch reads it with
// std::stod, which refuses subnormal values (out of range) as well as infinities and NaN.
std::string unwritable_float(double v) {
  if (!std::isfinite(v)) return "must be finite, got " + shortest_double(v);
  if (v != 0 && std::fabs(v) < DBL_MIN) {
    return "must be 0 or of magnitude >= " + shortest_double(DBL_MIN) + " (torch cannot read the subnormal " +
           shortest_double(v) + ")";
  }
  return {};
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t k = i; k < s.size(); ++k) {
    if (!std::isdigit(static_cast<unsigned char>(s[k]))) return false;
  }
  try {
    *out = std::stoll(s);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

}  // namespace

namespace {

// Reads an output rule's dimensions (see OutputDecl) into postfix expressions.
class RuleParser {
 public:
  RuleParser(const OpDecl& decl, const std::string& rule) : decl_(decl), s_(rule) {}

  std::vector<std::vector<DimTerm>> parse(std::string* error) {
    std::vector<std::vector<DimTerm>> dims;
    try {
      do {
        std::vector<DimTerm> expr;
        if (eat("?")) {
          expr.push_back({DimTerm::kDynamic, 0, 0});
        } else {
          sum(&expr);
        }
        dims.push_back(std::move(expr));
      } while (eat(","));
      skip();
      if (pos_ != s_.size()) fail("expected ',', an operator or the end");
    } catch (const std::invalid_argument& e) {
      *error = e.what();
      return {};
    }
    return dims;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("cannot read shape rule '" + s_ + "' at position " + std::to_string(pos_) + ": " +
                                what + " (a rule is an input name, or per dimension: integers, input[dim], int "
                                "attributes, + - * // % and parentheses; ? where the input values decide)");
  }
  void skip() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
  }
  bool eat(const char* tok) {
    skip();
    const size_t n = std::strlen(tok);
    if (s_.compare(pos_, n, tok) != 0) return false;
    pos_ += n;
    return true;
  }
  void sum(std::vector<DimTerm>* out) {
    product(out);
    for (;;) {
      if (eat("+")) {
        product(out);
        out->push_back({DimTerm::kAdd, 0, 0});
      } else if (eat("-")) {
        product(out);
        out->push_back({DimTerm::kSub, 0, 0});
      } else {
        return;
      }
    }
  }
  void product(std::vector<DimTerm>* out) {
    primary(out);
    for (;;) {
      if (eat("*")) {
        primary(out);
        out->push_back({DimTerm::kMul, 0, 0});
      } else if (eat("//")) {
        primary(out);
        out->push_back({DimTerm::kFloorDiv, 0, 0});
      } else if (eat("%")) {
        primary(out);
        out->push_back({DimTerm::kMod, 0, 0});
      } else if (skip(), pos_ < s_.size() && s_[pos_] == '/') {
        fail("'/' is not an operator of shape rules (use // for floor division)");
      } else {
        return;
      }
    }
  }
  bool integer(int64_t* value) {
    skip();
    const size_t b = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (pos_ == b) return false;
    if (!parse_int(s_.substr(b, pos_ - b), value)) {
      pos_ = b;
      fail("integer out of range");
    }
    return true;
  }
  void primary(std::vector<DimTerm>* out) {
    int64_t value = 0;
    if (eat("(")) {
      sum(out);
      if (!eat(")")) fail("expected ')'");
      return;
    }
    if (integer(&value)) {
      out->push_back({DimTerm::kConst, value, 0});
      return;
    }
    skip();
    const size_t b = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    const std::string name = s_.substr(b, pos_ - b);
    if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) {
      pos_ = b;
      fail(pos_ == s_.size() ? "expected a size, got the end" : "expected a size");
    }
    const int64_t input = decl_.input_index(name);
    if (input >= 0) {
      if (!eat("[")) fail("input " + name + " needs a dimension, e.g. " + name + "[0]");
      const bool negative = eat("-");
      if (!integer(&value)) fail("expected a dimension");
      if (!eat("]")) fail("expected ']'");
      out->push_back({DimTerm::kInputDim, input, negative ? -value : value});
      return;
    }
    const int64_t attr = decl_.attr_index(name);
    if (attr >= 0) {
      const ArgDecl& a = *decl_.attrs()[static_cast<size_t>(attr)];
      if (a.attr_type != AttrType::kInt) {
        pos_ = b;
        fail("attribute " + name + " is " + attr_type_name(a.attr_type) + ", a size needs an int attribute");
      }
      out->push_back({DimTerm::kAttr, attr, 0});
      return;
    }
    pos_ = b;
    fail("'" + name + "' is neither an input nor an attribute of op " + decl_.name());
  }

  const OpDecl& decl_;
  const std::string& s_;
  size_t pos_ = 0;
};

std::vector<std::vector<DimTerm>> parse_shape_rule(const OpDecl& decl, const std::string& rule, std::string* error) {
  return RuleParser(decl, rule).parse(error);
}

}  // namespace

void OpDecl::finish_declaration() const {
  derived_.finished = true;
  auto& inputs_ = derived_.inputs;
  auto& attrs_ = derived_.attrs;
  inputs_.clear();
  attrs_.clear();
  std::vector<std::string> errors = build_errors_;
  auto* self = const_cast<OpDecl*>(this);
  std::set<std::string> names, onnx_inputs, onnx_attrs;
  if (!valid_identifier(name_)) errors.push_back("name '" + name_ + "' is not a valid identifier");
  if (!valid_identifier(onnx_type_)) errors.push_back("onnx_type '" + onnx_type_ + "' is not a valid identifier");
  if (since_ < 1) errors.push_back("since must be >= 1, got " + std::to_string(since_));
  if (reserved_word(name_)) errors.push_back("name '" + name_ + "' is a reserved word of torch schemas and Python");
  const ArgDecl* first_default = nullptr;
  for (ArgDecl& a : self->args_) {
    const std::string where = "argument " + a.name + ": ";
    if (!valid_identifier(a.name)) errors.push_back(where + "name is not a valid identifier");
    if (reserved_word(a.name)) errors.push_back(where + "name is a reserved word of torch schemas and Python");
    if (!names.insert(a.name).second) errors.push_back(where + "declared twice");
    if (a.since == 0) a.since = since_;
    if (a.since < since_) errors.push_back(where + "since " + std::to_string(a.since) + " is before the op's first version " + std::to_string(since_));
    if (a.is_input) {
      a.input_index = static_cast<int64_t>(inputs_.size());
      inputs_.push_back(&a);
      if (!onnx_inputs.insert(a.onnx_name).second) errors.push_back(where + "ONNX input name '" + a.onnx_name + "' used twice");
      if (type_var(a.type_var) == nullptr) errors.push_back(where + "type variable '" + a.type_var + "' has no types() declaration");
      if (a.since > since_ && !a.optional) errors.push_back(where + "an input added in a later version must be optional()");
    } else {
      a.attr_index = static_cast<int64_t>(attrs_.size());
      attrs_.push_back(&a);
      if (!onnx_attrs.insert(a.onnx_name).second) errors.push_back(where + "ONNX attribute name '" + a.onnx_name + "' used twice");
      if (!a.required && !a.has_default) errors.push_back(where + "an attribute needs a default or required()");
      if (a.since > since_ && !a.has_default) errors.push_back(where + "an attribute added in a later version needs a default");
      if (a.has_default && !a.choices.empty()) {
        bool found = false;
        for (const std::string& c : a.choices) found = found || c == a.default_value.s;
        if (!found) errors.push_back(where + "default '" + a.default_value.s + "' is not one of its choices");
      }
      if (a.has_default && a.attr_type == AttrType::kFloat) {
        const std::string why = unwritable_float(a.default_value.f);
        if (!why.empty()) errors.push_back(where + "default " + why);
      }
      for (size_t k = 0; a.has_default && a.attr_type == AttrType::kFloats && k < a.default_value.floats.size(); ++k) {
        const std::string why = unwritable_float(a.default_value.floats[k]);
        if (!why.empty()) errors.push_back(where + "default[" + std::to_string(k) + "] " + why);
      }
      if (a.has_default && a.attr_type == AttrType::kString) {
        const std::string why = unwritable_string(a.default_value.s);
        if (!why.empty()) errors.push_back(where + "default " + why);
      }
      for (const std::string& c : a.choices) {
        const std::string why = unwritable_string(c);
        if (!why.empty()) errors.push_back(where + "choice " + std::to_string(&c - a.choices.data()) + " " + why);
      }
    }
    // torch schemas (and Python signatures) take the arguments without a default first: one
    // after an optional input or an attribute with a default is refused there.
    const bool has_default = a.is_input ? a.optional : a.has_default;
    if (has_default && first_default == nullptr) first_default = &a;
    if (!has_default && first_default != nullptr) {
      errors.push_back(where + "a required " + (a.is_input ? "input" : "attribute") + " cannot follow " +
                       (first_default->is_input ? "the optional input " : "the attribute with a default ") +
                       first_default->name + " (torch schemas and Python signatures put the arguments without a "
                       "default first): declare it before " + first_default->name +
                       (a.is_input ? ", or make it optional()" : ", or give it a default"));
    }
  }
  if (inputs_.empty()) errors.push_back("an op needs at least one tensor input");
  std::set<std::string> tv_names;
  for (const TypeVarDecl& t : type_vars_) {
    if (!tv_names.insert(t.name).second) errors.push_back("type variable '" + t.name + "' declared twice");
    if (t.types.empty()) errors.push_back("type variable '" + t.name + "' allows no types");
    for (ElemType e : t.types) {
      if (std::string(elem_type_name(e)) == "undefined") {
        errors.push_back("type variable '" + t.name + "': unknown element type " + std::to_string(static_cast<int>(e)));
      }
    }
  }
  if (outputs_.empty()) errors.push_back("an op needs at least one output");
  if (outputs_.size() > 64) errors.push_back("an op has at most 64 outputs, got " + std::to_string(outputs_.size()));
  // An op with a forward (a backward op): the forward's checks run on its arguments (check_call),
  // so it must take each of them, of the same kind and type.
  if (const OpDecl* fwd = forward()) {
    const std::string where = (gradient_of_ != nullptr ? "gradient_of(" : "args_of(") + fwd->name() + "): ";
    if (gradient_of_ != nullptr && !fwd->error().empty()) errors.push_back(where + "the forward is misdeclared");
    for (const ArgDecl& f : fwd->args()) {
      const ArgDecl* mine = nullptr;
      for (const ArgDecl& a : args_) mine = a.name == f.name ? &a : mine;
      if (mine == nullptr) {
        errors.push_back(where + "the forward's argument " + f.name + " is missing (args_of() adds them all)");
      } else if (mine->is_input != f.is_input || (!f.is_input && mine->attr_type != f.attr_type)) {
        errors.push_back(where + "argument " + f.name + " must be " +
                         (f.is_input ? std::string("a tensor input")
                                     : std::string(attr_type_name(f.attr_type)) + " attribute") +
                         ", as in the forward");
      }
    }
  }
  // A backward op: which inputs are gradients, and that its outputs match what it differentiates.
  if (gradient_of_ != nullptr) {
    const std::string where = "gradient_of(" + gradient_of_->name() + "): ";
    const std::vector<OutputDecl>& fwd_outputs = gradient_of_->outputs();
    size_t grads = 0, wanted = 0;
    for (const OutputDecl& o : fwd_outputs) wanted += o.differentiable ? 1 : 0;
    for (ArgDecl& a : self->args_) {
      bool forward_arg = false;
      for (const ArgDecl& f : gradient_of_->args()) forward_arg = forward_arg || f.name == a.name;
      a.forward_output = -1;
      for (size_t o = 0; a.is_input && !forward_arg && o < fwd_outputs.size(); ++o) {
        if (fwd_outputs[o].name == a.name) a.forward_output = static_cast<int64_t>(o);
      }
      if (a.forward_output >= 0) {
        const OutputDecl& o = fwd_outputs[static_cast<size_t>(a.forward_output)];
        const TypeVarDecl* mine = type_var(a.type_var);
        const TypeVarDecl* theirs = gradient_of_->type_var(o.type_var);
        if (mine == nullptr || theirs == nullptr || mine->types != theirs->types) {
          errors.push_back(where + "input " + a.name + " is the forward's output " + o.name +
                           ", so its type variable must allow the types of the forward's '" + o.type_var + "'");
        }
        if (a.optional) errors.push_back(where + "input " + a.name + " (the forward's output) cannot be optional");
      }
      a.gradient = a.is_input && !forward_arg && a.forward_output < 0;
      if (!a.is_input && !forward_arg) errors.push_back(where + "attribute " + a.name + " is not one of the forward's");
      grads += a.gradient ? 1 : 0;
    }
    if (grads != wanted) {
      std::string skipped;
      for (const OutputDecl& o : fwd_outputs) {
        if (!o.differentiable) skipped += (skipped.empty() ? "" : ", ") + o.name;
      }
      errors.push_back(where + "needs one gradient input per differentiable forward output (" +
                       std::to_string(wanted) + (skipped.empty() ? "" : "; not differentiable: " + skipped) +
                       "), has " + std::to_string(grads) +
                       " (an input named like a forward output is that output, not its gradient)");
    }
    if (gradient_wrt_.size() != outputs_.size()) {
      errors.push_back(where + std::to_string(gradient_wrt_.size()) + " inputs to differentiate, " +
                       std::to_string(outputs_.size()) + " outputs");
    }
    for (const std::string& w : gradient_wrt_) {
      if (gradient_of_->input_index(w) < 0) errors.push_back(where + w + " is not an input of the forward");
    }
  }
  auto& order = derived_.check_order;
  order.clear();
  for (const ArgDecl* a : inputs_) {
    if (!a->gradient) order.push_back(a);
  }
  for (const ArgDecl* a : inputs_) {
    if (a->gradient) order.push_back(a);
  }
  for (OutputDecl& o : self->outputs_) {
    const std::string where = "output " + o.name + ": ";
    if (type_var(o.type_var) == nullptr) errors.push_back(where + "type variable '" + o.type_var + "' has no types() declaration");
    bool bound = false;
    for (const ArgDecl* in : inputs_) bound = bound || (in->type_var == o.type_var && !in->optional);
    // A type variable of one type fixes the output's type (int64 indices of float points).
    const TypeVarDecl* tv = type_var(o.type_var);
    if (!bound && !(tv != nullptr && tv->types.size() == 1)) {
      errors.push_back(where + "type variable '" + o.type_var + "' is bound by no required input and has more than one type");
    }
    // Integers and bools have no gradient; a floating output has one unless declared otherwise.
    bool floating = tv != nullptr;
    for (size_t t = 0; tv != nullptr && t < tv->types.size(); ++t) floating = floating && is_floating(tv->types[t]);
    o.differentiable = floating && !o.declared_not_differentiable;
    o.like_input = -1;
    o.dims.clear();
    const std::string rule = trim(o.rule);
    const int64_t like = input_index(rule);
    if (like >= 0) {
      o.like_input = like;
      continue;
    }
    if (rule.empty()) {
      errors.push_back(where + "empty shape rule");
      continue;
    }
    std::string error;
    o.dims = parse_shape_rule(*this, o.rule, &error);
    if (!error.empty()) errors.push_back(where + error);
  }
  std::string msg;
  for (const std::string& e : errors) msg += (msg.empty() ? "" : "; ") + e;
  derived_.error = msg.empty() ? std::string() : "op " + name_ + ": " + msg;
}

const std::string& OpDecl::error() const {
  finish();
  return derived_.error;
}

// ---------------------------------------------------------------- OpCall

OpCall::OpCall(const OpDecl& decl) : decl_(&decl) {
  decl.finish();
  inputs_.resize(decl.inputs().size());
  attrs_.reserve(decl.attrs().size());
  for (const ArgDecl* a : decl.attrs()) attrs_.push_back(a->default_value);
}

const TensorArg& OpCall::in(std::string_view name) const {
  const int64_t i = decl_->input_index(name);
  if (i < 0) throw std::logic_error("op " + decl_->name() + " has no input " + std::string(name));
  return inputs_[static_cast<size_t>(i)];
}
TensorArg& OpCall::in(std::string_view name) {
  return const_cast<TensorArg&>(static_cast<const OpCall*>(this)->in(name));
}

const AttrValue& OpCall::attr_named(std::string_view name, AttrType type) const {
  const int64_t i = decl_->attr_index(name);
  if (i < 0) throw std::logic_error("op " + decl_->name() + " has no attribute " + std::string(name));
  const AttrValue& v = attrs_[static_cast<size_t>(i)];
  if (v.type != type && !(type == AttrType::kInt && v.type == AttrType::kBool)) {
    throw std::logic_error("attribute " + std::string(name) + " of op " + decl_->name() + " is not " +
                           attr_type_name(type));
  }
  return v;
}

void OpCall::set_int(std::string_view n, int64_t v) { const_cast<AttrValue&>(attr_named(n, AttrType::kInt)).i = v; }
void OpCall::set_float(std::string_view n, double v) {
  const_cast<AttrValue&>(attr_named(n, AttrType::kFloat)).f = v;
}
void OpCall::set_string(std::string_view n, std::string v) {
  const_cast<AttrValue&>(attr_named(n, AttrType::kString)).s = std::move(v);
}

int64_t OpCall::attr_int(std::string_view n) const { return attr_named(n, AttrType::kInt).i; }
double OpCall::attr_float(std::string_view n) const { return attr_named(n, AttrType::kFloat).f; }
bool OpCall::attr_bool(std::string_view n) const { return attr_named(n, AttrType::kBool).i != 0; }
const std::string& OpCall::attr_string(std::string_view n) const { return attr_named(n, AttrType::kString).s; }
const std::vector<int64_t>& OpCall::attr_ints(std::string_view n) const { return attr_named(n, AttrType::kInts).ints; }
const std::vector<double>& OpCall::attr_floats(std::string_view n) const {
  return attr_named(n, AttrType::kFloats).floats;
}

// ---------------------------------------------------------------- checks

namespace {

std::string type_list(const std::vector<ElemType>& types) {
  std::string s;
  for (size_t i = 0; i < types.size(); ++i) {
    if (i > 0) s += i + 1 == types.size() ? " or " : ", ";
    s += elem_type_name(types[i]);
  }
  return s;
}

std::string shape_suffix(const ArgDecl& a) { return a.shape_doc.empty() ? "" : " " + a.shape_doc; }

bool same_value(const AttrValue& a, const AttrValue& b) {
  switch (a.type) {
    case AttrType::kInt:
    case AttrType::kBool: return a.i == b.i;
    case AttrType::kFloat: return a.f == b.f || (std::isnan(a.f) && std::isnan(b.f));
    case AttrType::kString: return a.s == b.s;
    case AttrType::kInts: return a.ints == b.ints;
    case AttrType::kFloats: return a.floats == b.floats;
  }
  return false;
}

}  // namespace

Status check_attributes(const OpCall& call) {
  const OpDecl& d = call.decl();
  for (const ArgDecl* a : d.attrs()) {
    const AttrValue& v = call.attr(static_cast<size_t>(a->attr_index));
    if (a->choices.empty()) continue;
    bool ok = false;
    std::string list;
    for (size_t i = 0; i < a->choices.size(); ++i) {
      ok = ok || a->choices[i] == v.s;
      list += (i == 0 ? "'" : i + 1 == a->choices.size() ? " or '" : ", '") + a->choices[i] + "'";
    }
    if (!ok) return Status::InvalidArgument(a->name + " must be " + list + ", got '" + v.s + "'");
  }
  return Status::Ok();
}

Status check_index_values(const OpCall& call, std::string_view name, int64_t lo, int64_t hi) {
  const TensorArg& t = call.in(name);
  const int64_t* v = t.int64_data();
  const int64_t n = t.numel();
  for (int64_t i = 0; v != nullptr && i < n; ++i) {
    if (v[i] < lo || v[i] >= hi) {
      return Status::InvalidArgument(std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(v[i]) +
                                     " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
    }
  }
  return Status::Ok();
}

OpCall forward_call(const OpCall& backward) {
  const OpDecl* fwd = backward.decl().forward();
  if (fwd == nullptr) throw std::logic_error("forward_call: op " + backward.decl().name() + " has no forward");
  OpCall call(*fwd);
  for (const ArgDecl* a : fwd->inputs()) call.input(static_cast<size_t>(a->input_index)) = backward.in(a->name);
  for (const ArgDecl* a : fwd->attrs()) {
    const int64_t i = backward.decl().attr_index(a->name);
    call.attr(static_cast<size_t>(a->attr_index)) = backward.attr(static_cast<size_t>(i));
  }
  return call;
}

namespace {

std::string dims_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + (shape[i] >= 0 ? std::to_string(shape[i]) : "?");
  return s + "]";
}

// Gradient input k of a backward op has the shape forward output k has for the same arguments
// (`fc`, forward_call(call); where both are known: shape inference and fake kernels may not know
// every size).
Status check_gradient_shapes(const OpCall& call, const OpCall& fc) {
  const OpDecl& fwd = fc.decl();
  // The k-th gradient input is that of the k-th differentiable output.
  std::vector<size_t> differentiable;
  for (size_t o = 0; o < fwd.outputs().size(); ++o) {
    if (fwd.outputs()[o].differentiable) differentiable.push_back(o);
  }
  size_t k = 0;
  for (const ArgDecl* a : call.decl().inputs()) {
    if (!a->gradient && a->forward_output < 0) continue;
    const size_t out = a->gradient ? differentiable.at(k++) : static_cast<size_t>(a->forward_output);
    const TensorArg& g = call.input(static_cast<size_t>(a->input_index));
    if (!g.present || !g.rank_known) continue;
    const OutputDecl& o = fwd.outputs().at(out);
    const std::vector<int64_t> want = output_shape(fc, out);
    if (want.empty() && o.like_input >= 0) continue;  // the rank of the input it is like is unknown
    bool same = g.rank() == static_cast<int64_t>(want.size());
    for (size_t i = 0; same && i < want.size(); ++i) {
      same = want[i] < 0 || g.shape[i] < 0 || g.shape[i] == want[i];
    }
    if (!same) {
      return Status::InvalidArgument(a->name + " must have the shape of " + fwd.name() + "'s output " + o.name + " " +
                                     dims_string(want) + " (rule '" + o.rule + "'), got " + dims_string(g.shape));
    }
  }
  return Status::Ok();
}

}  // namespace

Status check_call(const OpCall& call) {
  const OpDecl& d = call.decl();
  if (!d.error().empty()) return Status::InvalidArgument(d.error());
  // Element types: allowed, and equal across the inputs of one type variable.
  for (const TypeVarDecl& tv : d.type_vars()) {
    const TensorArg* first = nullptr;
    const ArgDecl* first_decl = nullptr;
    for (const ArgDecl* a : d.check_order()) {
      if (a->type_var != tv.name) continue;
      const TensorArg& t = call.input(static_cast<size_t>(a->input_index));
      if (!t.present || t.type == ElemType::kUndefined) continue;
      bool ok = false;
      for (ElemType e : tv.types) ok = ok || e == t.type;
      if (!ok) {
        const std::string list = type_list(tv.types);
        // "an int64 tensor", "a float32 tensor"
        const char* article = list[0] == 'i' ? "an " : "a ";
        return Status(StatusCode::kTypeError,
                      a->name + " must be " + article + list + " tensor, got " + elem_type_name(t.type));
      }
      if (first == nullptr) {
        first = &t;
        first_decl = a;
      } else if (t.type != first->type) {
        return Status(StatusCode::kTypeError, a->name + " must have the dtype of " + first_decl->name + " (" +
                                                  elem_type_name(first->type) + "), got " + elem_type_name(t.type));
      }
    }
  }
  for (const ArgDecl* a : d.inputs()) {
    const TensorArg& t = call.input(static_cast<size_t>(a->input_index));
    if (!t.present) {
      if (!a->optional) return Status::InvalidArgument("input " + a->name + " is required but missing");
      continue;
    }
    if (!t.rank_known) continue;
    if (a->rank >= 0 && t.rank() != a->rank) {
      return Status::InvalidArgument(a->name + " must have rank " + std::to_string(a->rank) + shape_suffix(*a) +
                                     ", got rank " + std::to_string(t.rank()));
    }
    if (a->min_rank >= 0 && t.rank() < a->min_rank) {
      return Status::InvalidArgument(a->name + " must have rank >= " + std::to_string(a->min_rank) +
                                     shape_suffix(*a) + ", got rank " + std::to_string(t.rank()));
    }
  }
  OPBRIDGE_RETURN_IF_ERROR(check_attributes(call));
  // A backward op: first every check of its forward on the forward's arguments, however the
  // backward was declared (its kernel trusts them as the forward's does), ...
  const OpDecl* fwd = d.forward();
  std::optional<OpCall> fc;
  if (fwd != nullptr) {
    fc.emplace(forward_call(call));
    OPBRIDGE_RETURN_IF_ERROR(check_call(*fc));
  }
  // ... then its own (unless it is the forward's, which just ran), ...
  if (d.validate_fn() != nullptr && (fwd == nullptr || d.validate_fn() != fwd->validate_fn())) {
    OPBRIDGE_RETURN_IF_ERROR(d.validate_fn()(call));
  }
  // ... then each gradient has the shape of the forward output it is the gradient of.
  if (d.gradient_of() != nullptr) OPBRIDGE_RETURN_IF_ERROR(check_gradient_shapes(call, *fc));
  // Output sizes the rules give (after the op's own checks, whose messages say more).
  for (const OutputDecl& o : d.outputs()) {
    for (const auto& expr : o.dims) {
      std::string error;
      eval_dim(call, expr, &error);
      if (!error.empty()) {
        return Status::InvalidArgument("output " + o.name + ": shape rule '" + o.rule + "' " + error);
      }
    }
  }
  return Status::Ok();
}

std::vector<int64_t> output_shape(const OpCall& call, size_t output) {
  const OutputDecl& o = call.decl().outputs().at(output);
  if (call.decl().output_shape_function() != nullptr) return call.decl().output_shape_function()(call, output);
  if (o.like_input >= 0) {
    const TensorArg& t = call.input(static_cast<size_t>(o.like_input));
    if (!t.rank_known) return {};
    std::vector<int64_t> s = t.shape;
    for (int64_t& v : s) v = v < 0 ? -1 : v;
    return s;
  }
  std::vector<int64_t> shape;
  for (const auto& expr : o.dims) shape.push_back(eval_dim(call, expr));
  return shape;
}

std::string unsized_output(const OpCall& call, size_t output, const std::vector<int64_t>& shape) {
  for (int64_t d : shape) {
    if (d < 0) {
      const OutputDecl& o = call.decl().outputs().at(output);
      return "output " + o.name + " (rule '" + o.rule + "') has a size the input values decide: its kernel " +
             "sizes it (KernelCall::out<T>(i, shape))";
    }
  }
  return {};
}

bool sized_by_kernel(const OpDecl& decl, size_t output) {
  if (decl.output_shape_function() != nullptr) return false;
  for (const auto& expr : decl.outputs().at(output).dims) {
    for (const DimTerm& t : expr) {
      if (t.kind == DimTerm::kDynamic) return true;
    }
  }
  return false;
}

std::string check_kernel_shape(const OpDecl& decl, size_t output, const std::vector<int64_t>& known,
                               const std::vector<int64_t>& shape) {
  const OutputDecl& o = decl.outputs().at(output);
  std::string why;
  if (!sized_by_kernel(decl, output)) {
    why = "is allocated by the adapter (its rule has no '?'): use out<T>(" + std::to_string(output) + ")";
  } else if (shape.size() != known.size()) {
    why = "needs rank " + std::to_string(known.size()) + ", got rank " + std::to_string(shape.size());
  } else {
    for (size_t i = 0; i < shape.size() && why.empty(); ++i) {
      if (shape[i] < 0 || (known[i] >= 0 && shape[i] != known[i])) {
        why = "dimension " + std::to_string(i) + " must be " +
              (known[i] >= 0 ? std::to_string(known[i]) : std::string(">= 0")) + ", got " + std::to_string(shape[i]);
      }
    }
  }
  return why.empty() ? why : "output " + o.name + " (rule '" + o.rule + "') " + why;
}

int64_t eval_dim(const OpCall& call, const std::vector<DimTerm>& expr, std::string* error) {
  struct Value {
    int64_t v;
    bool known;
  };
  std::vector<Value> stack;
  stack.reserve(expr.size());
  for (const DimTerm& t : expr) {
    switch (t.kind) {
      case DimTerm::kConst:
        stack.push_back({t.a, true});
        continue;
      case DimTerm::kInputDim: {
        const TensorArg& in = call.input(static_cast<size_t>(t.a));
        const int64_t v = in.present && in.rank_known ? in.dim(t.b) : -1;
        stack.push_back({v, v >= 0});
        continue;
      }
      case DimTerm::kAttr:
        stack.push_back({call.attr(static_cast<size_t>(t.a)).i, true});
        continue;
      case DimTerm::kDynamic:
        stack.push_back({-1, false});
        continue;
      default:
        break;
    }
    const Value y = stack.back();
    stack.pop_back();
    Value& x = stack.back();
    if (y.known && y.v == 0 && (t.kind == DimTerm::kFloorDiv || t.kind == DimTerm::kMod)) {
      if (error != nullptr) *error = "divides by zero";
      return -1;
    }
    x.known = x.known && y.known;
    if (!x.known) continue;
    bool overflow = false;
    switch (t.kind) {
      case DimTerm::kAdd:
        overflow = __builtin_add_overflow(x.v, y.v, &x.v);
        break;
      case DimTerm::kSub:
        overflow = __builtin_sub_overflow(x.v, y.v, &x.v);
        break;
      case DimTerm::kMul:
        overflow = __builtin_mul_overflow(x.v, y.v, &x.v);
        break;
      case DimTerm::kFloorDiv:
      case DimTerm::kMod: {
        if (x.v == INT64_MIN && y.v == -1) {
          overflow = true;
          break;
        }
        int64_t q = x.v / y.v;
        int64_t r = x.v % y.v;
        if (r != 0 && ((r < 0) != (y.v < 0))) {  // floor, as Python
          q -= 1;
          r += y.v;
        }
        x.v = t.kind == DimTerm::kFloorDiv ? q : r;
        break;
      }
      default:
        break;
    }
    if (overflow) {
      if (error != nullptr) *error = "overflows int64";
      return -1;
    }
  }
  if (stack.size() != 1 || !stack[0].known) return -1;
  if (stack[0].v < 0) {
    if (error != nullptr) *error = "gives " + std::to_string(stack[0].v) + ", a size must be >= 0";
    return -1;
  }
  return stack[0].v;
}

ElemType output_type(const OpCall& call, size_t output) {
  const OutputDecl& o = call.decl().outputs().at(output);
  for (const ArgDecl* a : call.decl().inputs()) {
    const TensorArg& t = call.input(static_cast<size_t>(a->input_index));
    if (a->type_var == o.type_var && t.present) return t.type;
  }
  const TypeVarDecl* tv = call.decl().type_var(o.type_var);
  return tv != nullptr && tv->types.size() == 1 ? tv->types[0] : ElemType::kUndefined;
}

int required_version(const OpCall& call) {
  const OpDecl& d = call.decl();
  int v = d.since_version();
  for (const ArgDecl* a : d.inputs()) {
    if (call.input(static_cast<size_t>(a->input_index)).present) v = std::max(v, a->since);
  }
  for (const ArgDecl* a : d.attrs()) {
    if (!a->has_default || !same_value(call.attr(static_cast<size_t>(a->attr_index)), a->default_value)) {
      v = std::max(v, a->since);
    }
  }
  return v;
}

// ---------------------------------------------------------------- JSON

namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_double(double v) {
  // Python's json module reads these (JSON has no spelling for them); only a misdeclared op,
  // which the reader refuses, has a default that is not finite.
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  std::string s = shortest_double(v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string json_value(const AttrValue& v) {
  switch (v.type) {
    case AttrType::kInt: return std::to_string(v.i);
    case AttrType::kBool: return v.i ? "true" : "false";
    case AttrType::kFloat: return json_double(v.f);
    case AttrType::kString: return json_string(v.s);
    case AttrType::kInts: {
      std::string s = "[";
      for (size_t i = 0; i < v.ints.size(); ++i) s += (i ? "," : "") + std::to_string(v.ints[i]);
      return s + "]";
    }
    case AttrType::kFloats: {
      std::string s = "[";
      for (size_t i = 0; i < v.floats.size(); ++i) s += (i ? "," : "") + json_double(v.floats[i]);
      return s + "]";
    }
  }
  return "null";
}

}  // namespace

const char* attr_type_key(AttrType t) {
  switch (t) {
    case AttrType::kInt: return "int";
    case AttrType::kFloat: return "float";
    case AttrType::kString: return "str";
    case AttrType::kBool: return "bool";
    case AttrType::kInts: return "int[]";
    case AttrType::kFloats: return "float[]";
  }
  return "?";
}

double float_attribute(double v) {
  if (std::isnan(v)) return v;
  // Out of float32's range the conversion is undefined behaviour; ONNX writes such a value as inf.
  if (std::fabs(v) > static_cast<double>(std::numeric_limits<float>::max())) {
    return std::copysign(std::numeric_limits<double>::infinity(), v);
  }
  return static_cast<double>(static_cast<float>(v));
}

std::string shortest_double(double v) {
  char buf[32];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string describe_ops_json(const std::vector<const OpDecl*>& ops, const std::string& domain, int domain_version) {
  std::ostringstream j;
  j << "{\"domain\":" << json_string(domain) << ",\"domain_version\":" << domain_version << ",\"ops\":[";
  for (size_t k = 0; k < ops.size(); ++k) {
    const OpDecl& d = *ops[k];
    j << (k ? "," : "") << "{\"name\":" << json_string(d.name()) << ",\"onnx_type\":" << json_string(d.onnx_type())
      << ",\"since\":" << d.since_version() << ",\"doc\":" << json_string(d.description())
      << ",\"error\":" << json_string(d.error())
      << ",\"forward\":" << (d.forward() != nullptr ? json_string(d.forward()->name()) : std::string("null"))
      << ",\"gradient_of\":";
    if (d.gradient_of() != nullptr) {
      j << "{\"op\":" << json_string(d.gradient_of()->name()) << ",\"wrt\":[";
      for (size_t w = 0; w < d.gradient_wrt().size(); ++w) j << (w ? "," : "") << json_string(d.gradient_wrt()[w]);
      j << "]}";
    } else {
      j << "null";
    }
    j << ",\"args\":[";
    for (size_t i = 0; i < d.args().size(); ++i) {
      const ArgDecl& a = d.args()[i];
      j << (i ? "," : "") << "{\"name\":" << json_string(a.name) << ",\"onnx_name\":" << json_string(a.onnx_name)
        << ",\"doc\":" << json_string(a.doc) << ",\"since\":" << a.since;
      if (a.is_input) {
        j << ",\"kind\":\"input\",\"type_var\":" << json_string(a.type_var)
          << ",\"optional\":" << (a.optional ? "true" : "false") << ",\"rank\":" << a.rank
          << ",\"min_rank\":" << a.min_rank << ",\"shape\":" << json_string(a.shape_doc)
          << ",\"host_memory\":" << (a.host_memory ? "true" : "false")
          << ",\"gradient\":" << (a.gradient ? "true" : "false")
          << ",\"forward_output\":" << a.forward_output;
      } else {
        j << ",\"kind\":\"attr\",\"type\":\"" << attr_type_key(a.attr_type) << "\""
          << ",\"required\":" << (a.required ? "true" : "false");
        if (a.has_default) j << ",\"default\":" << json_value(a.default_value);
        j << ",\"choices\":[";
        for (size_t c = 0; c < a.choices.size(); ++c) j << (c ? "," : "") << json_string(a.choices[c]);
        j << "]";
      }
      j << "}";
    }
    j << "],\"types\":{";
    for (size_t i = 0; i < d.type_vars().size(); ++i) {
      const TypeVarDecl& t = d.type_vars()[i];
      j << (i ? "," : "") << json_string(t.name) << ":[";
      for (size_t e = 0; e < t.types.size(); ++e) j << (e ? "," : "") << static_cast<int>(t.types[e]);
      j << "]";
    }
    j << "},\"outputs\":[";
    for (size_t i = 0; i < d.outputs().size(); ++i) {
      const OutputDecl& o = d.outputs()[i];
      j << (i ? "," : "") << "{\"name\":" << json_string(o.name) << ",\"type_var\":" << json_string(o.type_var)
        << ",\"rule\":" << json_string(o.rule) << ",\"doc\":" << json_string(o.doc)
        << ",\"keeps_memory_format\":" << (o.keeps_memory_format ? "true" : "false")
        << ",\"differentiable\":" << (o.differentiable ? "true" : "false")
        << ",\"like\":" << o.like_input << ",\"exprs\":[";
      // Per dimension its postfix expression, a [kind, a, b] triple per step (DimTerm).
      for (size_t p = 0; p < o.dims.size(); ++p) {
        j << (p ? "," : "") << "[";
        for (size_t f = 0; f < o.dims[p].size(); ++f) {
          const DimTerm& t = o.dims[p][f];
          j << (f ? "," : "") << "[" << static_cast<int>(t.kind) << "," << t.a << "," << t.b << "]";
        }
        j << "]";
      }
      j << "]}";
    }
    j << "]}";
  }
  j << "]}";
  return j.str();
}

}  // namespace opbridge
