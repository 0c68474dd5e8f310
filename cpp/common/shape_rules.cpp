// Output shape rules (OutputDecl::rule): parsed once into postfix expressions per dimension,
// evaluated against a call's input shapes and attributes.
#include "opbridge/op_decl.h"
#include "shape_rules.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace opbridge {

namespace {

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
  struct BinaryOp {
    const char* token;
    DimTerm::Kind kind;
  };
  // One precedence level, left-associative: an operand, then any number of (operator, operand),
  // written in postfix order. ops are tried in order.
  template <size_t K>
  void level(std::vector<DimTerm>* out, const BinaryOp (&ops)[K],
             void (RuleParser::*operand)(std::vector<DimTerm>*)) {
    (this->*operand)(out);
    for (;;) {
      const BinaryOp* op = std::find_if(ops, ops + K, [&](const BinaryOp& o) { return eat(o.token); });
      if (op == ops + K) return;
      (this->*operand)(out);
      out->push_back({op->kind, 0, 0});
    }
  }
  void sum(std::vector<DimTerm>* out) {
    static constexpr BinaryOp kOps[] = {{"+", DimTerm::kAdd}, {"-", DimTerm::kSub}};
    level(out, kOps, &RuleParser::product);
  }
  void product(std::vector<DimTerm>* out) {
    static constexpr BinaryOp kOps[] = {{"*", DimTerm::kMul}, {"//", DimTerm::kFloorDiv}, {"%", DimTerm::kMod}};
    level(out, kOps, &RuleParser::primary);
    if (skip(), pos_ < s_.size() && s_[pos_] == '/') {
      fail("'/' is not an operator of shape rules (use // for floor division)");
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

}  // namespace

namespace detail {

std::vector<std::vector<DimTerm>> parse_shape_rule(const OpDecl& decl, const std::string& rule, std::string* error) {
  return RuleParser(decl, rule).parse(error);
}

}  // namespace detail

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

}  // namespace opbridge
