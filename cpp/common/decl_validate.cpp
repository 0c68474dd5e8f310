// A declaration checks itself once, when first used (OpDecl::finish_declaration): names,
// defaults, type variables, output rules. What is wrong becomes OpDecl::error().
#include "opbridge/op_decl.h"
#include "shape_rules.h"

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace opbridge {

namespace {

bool is_floating(ElemType t) {
  return t == ElemType::kFloat32 || t == ElemType::kFloat64 || t == ElemType::kFloat16 || t == ElemType::kBFloat16;
}

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
    o.dims = detail::parse_shape_rule(*this, o.rule, &error);
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

}  // namespace opbridge
