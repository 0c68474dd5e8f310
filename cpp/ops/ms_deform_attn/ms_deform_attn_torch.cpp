// torch op opbridge::ms_deform_attn: schema and CPU implementation of forward and backward on the
// stable ABI (autograd, fake kernels and the mixed-precision wrapper are registered from Python, in
// opbridge/ops/ms_deform_attn.py). Validation is ms_deform_attn_check's, as in ORT and _core.
#include "opbridge/ms_deform_attn.h"
#include "torch_common.h"

namespace opbridge::torch_adapter {
namespace {

constexpr const char* kOp = "opbridge::ms_deform_attn";
constexpr const char* kBackwardOp = "opbridge::ms_deform_attn_backward";

MsDeformAttnArg arg(const Tensor& t) {
  const auto s = t.sizes();
  return {s.data(), static_cast<int64_t>(s.size()), dtype_name(dtype(t))};
}

void check_cpu(const Tensor& t, const char* name, const char* op) {
  // The CPU kernel is chosen when any argument is a CPU tensor; the others must be too (a CUDA
  // value with CPU spatial_shapes goes to the CUDA kernel instead).
  check_value(t.is_cpu(), op,
              std::string(name) + " must be a CPU tensor like the other arguments, got one on " + device_string(t));
}

struct Checked {
  MsDeformAttnDims d;
  Tensor shapes, starts;  // contiguous int64 (undefined where another dtype: the check says so)
};

Checked check(const Tensor& value, const Tensor& spatial_shapes, const Tensor& level_start_index,
              const Tensor& sampling_locations, const Tensor& attention_weights, const Tensor* grad_output) {
  const char* op = grad_output != nullptr ? kBackwardOp : kOp;
  check_cpu(value, "value", op);
  check_cpu(spatial_shapes, "spatial_shapes", op);
  check_cpu(level_start_index, "level_start_index", op);
  check_cpu(sampling_locations, "sampling_locations", op);
  check_cpu(attention_weights, "attention_weights", op);
  if (grad_output != nullptr) check_cpu(*grad_output, "grad_output", op);
  const bool ints =
      dtype(spatial_shapes) == ScalarType::Long && dtype(level_start_index) == ScalarType::Long;
  Checked c{{}, ints ? contiguous(spatial_shapes) : spatial_shapes, ints ? contiguous(level_start_index) : level_start_index};
  MsDeformAttnArg go;
  if (grad_output != nullptr) go = arg(*grad_output);
  check_status(ms_deform_attn_check(arg(value), arg(spatial_shapes), arg(level_start_index), arg(sampling_locations),
                                    arg(attention_weights), ints ? ptr<int64_t>(c.shapes) : nullptr,
                                    ints ? ptr<int64_t>(c.starts) : nullptr, grad_output != nullptr ? &go : nullptr,
                                    &c.d),
               op);
  return c;
}

void ms_deform_attn_cpu_impl(TorchCall& call) {
  const Tensor &value = call.in("value"), &loc_in = call.in("sampling_locations"),
               &aw_in = call.in("attention_weights");
  const Checked c = check(value, call.in("spatial_shapes"), call.in("level_start_index"), loc_in, aw_in, nullptr);
  const MsDeformAttnDims& d = c.d;
  const Tensor v = contiguous(value), loc = contiguous(loc_in), aw = contiguous(aw_in);
  Tensor out = empty({d.N, d.Lq, d.M * d.D}, dtype(value), value);
  dispatch_float(dtype(value), kOp, [&](auto tag) {
    using T = decltype(tag);
    check_status(ms_deform_attn_cpu<T>(ptr<T>(v), ptr<int64_t>(c.shapes), ptr<int64_t>(c.starts), ptr<T>(loc),
                                       ptr<T>(aw), mutable_ptr<T>(out), d, torch_parallel()),
                 kOp);
  });
  call.set_output(0, std::move(out));
}

// ms_deform_attn_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes,
// Tensor level_start_index, Tensor sampling_locations, Tensor attention_weights)
// -> (Tensor grad_value, Tensor grad_sampling_locations, Tensor grad_attention_weights)
void ms_deform_attn_backward_cpu_impl(StableIValue* stack, uint64_t num_args, uint64_t /*num_outputs*/) {
  const BoxedArgs args(stack, num_args);
  const Tensor grad_output = args.tensor(0), value = args.tensor(1), spatial_shapes = args.tensor(2),
               level_start_index = args.tensor(3), sampling_locations = args.tensor(4),
               attention_weights = args.tensor(5);
  const Checked c =
      check(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, &grad_output);
  const MsDeformAttnDims& d = c.d;
  const Tensor go = contiguous(grad_output), v = contiguous(value), loc = contiguous(sampling_locations),
               aw = contiguous(attention_weights);
  Tensor grad_value = empty_like(v), grad_loc = empty_like(loc), grad_aw = empty_like(aw);
  dispatch_float(dtype(value), kOp, [&](auto tag) {
    using T = decltype(tag);
    check_status(ms_deform_attn_backward_cpu<T>(ptr<T>(go), ptr<T>(v), ptr<int64_t>(c.shapes), ptr<int64_t>(c.starts),
                                                ptr<T>(loc), ptr<T>(aw), mutable_ptr<T>(grad_value),
                                                mutable_ptr<T>(grad_loc), mutable_ptr<T>(grad_aw), d, torch_parallel()),
                 kBackwardOp);
  });
  BoxedArgs::set(stack, 0, grad_value);
  BoxedArgs::set(stack, 1, grad_loc);
  BoxedArgs::set(stack, 2, grad_aw);
}

}  // namespace

OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) {
  define_op(m, ms_deform_attn_decl());
  // Gradients w.r.t. (value, sampling_locations, attention_weights).
  m.def("ms_deform_attn_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
        "Tensor sampling_locations, Tensor attention_weights) -> (Tensor, Tensor, Tensor)");
}

OPBRIDGE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("ms_deform_attn", OPBRIDGE_DECLARED_KERNEL(ms_deform_attn_decl, ms_deform_attn_cpu_impl));
  m.impl("ms_deform_attn_backward", &ms_deform_attn_backward_cpu_impl);
}

}  // namespace opbridge::torch_adapter
