// torch op opbridge::ms_deform_attn: schema and CPU implementation of forward and backward
// (autograd, fake kernels and the mixed-precision wrapper are registered from Python, in
// opbridge/ops/ms_deform_attn.py). Validation is ms_deform_attn_check's, as in ORT and _core.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <tuple>

#include "opbridge/ms_deform_attn.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::ms_deform_attn";
constexpr const char* kBackwardOp = "opbridge::ms_deform_attn_backward";

// The names ms_deform_attn_check speaks (numpy's / torch's Python names).
const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    default: return "another type";
  }
}

MsDeformAttnArg arg(const at::Tensor& t) { return {t.sizes().data(), t.dim(), dtype_name(t.scalar_type())}; }

void check_cpu(const at::Tensor& t, const char* name, const char* op) {
  // The CPU kernel is chosen when any argument is a CPU tensor; the others must be too (a CUDA
  // value with CPU spatial_shapes goes to the CUDA kernel instead).
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor like the other arguments, got one on ",
                    t.device());
}

struct Checked {
  MsDeformAttnDims d;
  at::Tensor shapes, starts;  // contiguous int64
};

Checked check(const at::Tensor& value, const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
              const at::Tensor& sampling_locations, const at::Tensor& attention_weights,
              const at::Tensor* grad_output) {
  const char* op = grad_output != nullptr ? kBackwardOp : kOp;
  check_cpu(value, "value", op);
  check_cpu(spatial_shapes, "spatial_shapes", op);
  check_cpu(level_start_index, "level_start_index", op);
  check_cpu(sampling_locations, "sampling_locations", op);
  check_cpu(attention_weights, "attention_weights", op);
  if (grad_output != nullptr) check_cpu(*grad_output, "grad_output", op);
  Checked c;
  const bool ints = spatial_shapes.scalar_type() == at::kLong && level_start_index.scalar_type() == at::kLong;
  if (ints) {
    c.shapes = spatial_shapes.contiguous();
    c.starts = level_start_index.contiguous();
  }
  MsDeformAttnArg go;
  if (grad_output != nullptr) go = arg(*grad_output);
  check_status(ms_deform_attn_check(arg(value), arg(spatial_shapes), arg(level_start_index), arg(sampling_locations),
                                    arg(attention_weights), ints ? ptr<int64_t>(c.shapes) : nullptr,
                                    ints ? ptr<int64_t>(c.starts) : nullptr, grad_output != nullptr ? &go : nullptr,
                                    &c.d),
               op);
  return c;
}

at::Tensor ms_deform_attn_cpu_impl(const at::Tensor& value, const at::Tensor& spatial_shapes,
                                   const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                                   const at::Tensor& attention_weights) {
  check_call(ms_deform_attn_decl(), kOp,
             {value, spatial_shapes, level_start_index, sampling_locations, attention_weights});
  const Checked c = check(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, nullptr);
  const MsDeformAttnDims& d = c.d;
  const at::Tensor v = value.contiguous(), loc = sampling_locations.contiguous(), aw = attention_weights.contiguous();
  at::Tensor out = at::empty({d.N, d.Lq, d.M * d.D}, value.options().memory_format(at::MemoryFormat::Contiguous));
  dispatch_float(value.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    check_status(ms_deform_attn_cpu<T>(ptr<T>(v), ptr<int64_t>(c.shapes), ptr<int64_t>(c.starts), ptr<T>(loc),
                                       ptr<T>(aw), mutable_ptr<T>(out), d, torch_parallel()),
                 kOp);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ms_deform_attn_backward_cpu_impl(
    const at::Tensor& grad_output, const at::Tensor& value, const at::Tensor& spatial_shapes,
    const at::Tensor& level_start_index, const at::Tensor& sampling_locations, const at::Tensor& attention_weights) {
  const Checked c =
      check(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, &grad_output);
  const MsDeformAttnDims& d = c.d;
  const at::Tensor go = grad_output.contiguous(), v = value.contiguous(), loc = sampling_locations.contiguous(),
                   aw = attention_weights.contiguous();
  at::Tensor grad_value = at::empty_like(v, at::MemoryFormat::Contiguous);
  at::Tensor grad_loc = at::empty_like(loc, at::MemoryFormat::Contiguous);
  at::Tensor grad_aw = at::empty_like(aw, at::MemoryFormat::Contiguous);
  dispatch_float(value.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    check_status(ms_deform_attn_backward_cpu<T>(ptr<T>(go), ptr<T>(v), ptr<int64_t>(c.shapes), ptr<int64_t>(c.starts),
                                                ptr<T>(loc), ptr<T>(aw), mutable_ptr<T>(grad_value),
                                                mutable_ptr<T>(grad_loc), mutable_ptr<T>(grad_aw), d, torch_parallel()),
                 kBackwardOp);
  });
  return {grad_value, grad_loc, grad_aw};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opbridge, m) {
  define_op(m, ms_deform_attn_decl());
  // Gradients w.r.t. (value, sampling_locations, attention_weights).
  m.def("ms_deform_attn_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
        "Tensor sampling_locations, Tensor attention_weights) -> (Tensor, Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(opbridge, CPU, m) {
  m.impl("ms_deform_attn", &ms_deform_attn_cpu_impl);
  m.impl("ms_deform_attn_backward", &ms_deform_attn_backward_cpu_impl);
}

}  // namespace opbridge::torch_adapter
