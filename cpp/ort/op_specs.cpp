// The ORT ops of a declared op: one OpSpec per combination of its type variables' element types
// (and per execution provider), served by the generic kernel and shape inference.
#include <string>
#include <utility>
#include <vector>

#include "declared_op.h"

namespace opbridge::ort {

using detail::compute_declared;
using detail::create_declared;
using detail::destroy_declared;
using detail::infer_declared;
using detail::onnx_elem;

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

}  // namespace opbridge::ort
