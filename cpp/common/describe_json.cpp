// The JSON description of a library's declarations (describe_ops_json), which the Python side
// reads to build schemas, signatures and checks; attribute type keys and float formatting.
#include "opbridge/op_decl.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace opbridge {

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
