// The parts of the generic ORT op that its files share (declared_kernel.cpp, shape_inference.cpp,
// op_specs.cpp). Not installed: ort_op.h is the public side.
#pragma once

#include "ort_op.h"

namespace opbridge::ort::detail {

inline ONNXTensorElementDataType onnx_elem(ElemType t) { return static_cast<ONNXTensorElementDataType>(t); }

// True when an ORT call failed; the status is released (callers report their own message).
inline bool failed(OrtStatus* st) {
  if (st == nullptr) return false;
  api().ReleaseStatus(st);
  return true;
}

// The value of an attribute the node does not set: the declared default, with float defaults
// rounded to float32 (float_attribute), so that leaving epsilon out runs as epsilon=1e-5 written
// in the model, and as torch's default.
AttrValue onnx_default(const ArgDecl& a);

void* create_declared(const OpSpec& spec, const OrtKernelInfo* info);
void compute_declared(void* kernel, OrtKernelContext* raw);
void destroy_declared(void* kernel);
void infer_declared(const OpSpec& spec, const InferIO& io);

}  // namespace opbridge::ort::detail
