// The optional fast-path library (libopbridge_torch_fastpath.so): libtorch's C++ API, so it loads
// only into the torch release it was built against (opbridge.ops loads it there; everything works
// without it, through the Python formulas, at the cost measured in docs/torch_versions.md). The
// torch extension proper (the ops' kernels) is on the stable ABI and needs none of this.
//
// The C++ kernel opbridge puts on an op's AutogradCPU and AutogradCUDA keys, in front of the
// autograd formula registered from Python (torch.library.register_autograd), which is a Python
// kernel for the Autograd alias key, entered on every call, gradient or not.
//
// opbridge::_no_grad_fast_path(qualname) installs it. It decides in C++:
// - grad mode off, or no tensor argument requires grad: the op's backend kernels below autograd,
//   exactly what torch's Python kernel does in that case (its forward_no_grad). That Python
//   kernel cost about 5.6 us per call on the Xeon of docs/benchmarks.md, twice what
//   F.group_norm takes in all on a small tensor.
// - a gradient is needed and the op has a backward op (opbridge::_cpp_autograd): the autograd
//   graph is built here, in C++, as torch's own ops do it: a node saving the arguments, whose
//   first-order backward calls the backward op. The Python formula's autograd.Function costs
//   about 30 us in the forward and 70 us in the backward of GroupNorm (1, 128, 32, 32), more than
//   its kernels (15 + 21 us). Where the gradient must itself be differentiable (grad mode on in
//   the backward: create_graph=True), the node recomputes the op through the Python formula and
//   differentiates that, so that higher orders are exactly what the formula defines (correct
//   gradients of any order, or its error).
// - otherwise: the Python formula itself. A kernel registered for the Autograd alias also serves
//   AutogradOther, so the call is redispatched there with the same backend keys.
// Forward-mode AD (dual tensors) is a clear error rather than a result without a tangent.
// Other ops and other autograd keys (Meta, ...) keep their kernels.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using torch::autograd::variable_list;

// A new graph node: torch 2.11 and 2.12 hold Nodes in std::shared_ptr, later releases in
// c10::intrusive_ptr (what Node::getptr() returns says which).
template <class N, class... Args>
auto make_node(Args&&... args) {
  using Ptr = decltype(std::declval<N&>().getptr());
  if constexpr (std::is_same_v<Ptr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<N>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<N>(std::forward<Args>(args)...);
  }
}

// Whether pred(t) holds for a defined tensor argument t (tensor lists included).
template <class Pred>
bool any_tensor_argument(const torch::jit::Stack& stack, size_t num_args, Pred pred) {
  for (size_t i = stack.size() - num_args; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      if (v.toTensor().defined() && pred(v.toTensor())) return true;
    } else if (v.isList()) {  // Tensor[] and Tensor?[]
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor() && e.toTensor().defined() && pred(e.toTensor())) return true;
      }
    }
  }
  return false;
}

bool any_requires_grad(const torch::jit::Stack& stack, size_t num_args) {
  return any_tensor_argument(stack, num_args, [](const at::Tensor& t) { return t.requires_grad(); });
}

// Whether a tensor argument is a dual tensor of forward-mode AD (torch.autograd.forward_ad): no
// formula of ours has a forward derivative, and the output would silently carry no tangent (as
// torch.library's own kernel lets it).
bool any_forward_grad(const torch::jit::Stack& stack, size_t num_args) {
  return any_tensor_argument(stack, num_args, [](const at::Tensor& t) { return t._fw_grad(/*level=*/0).defined(); });
}

// An op whose first-order gradients a backward op computes: backward(*grad_outputs, *args)
// returns the gradients of the arguments at `grads` (indices into the op's arguments), in order.
struct BackwardOp {
  c10::OperatorHandle op;
  std::vector<int64_t> grads;
};

std::mutex& registry_mutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

std::map<std::string, std::shared_ptr<const BackwardOp>>& registry() {
  static auto* r = new std::map<std::string, std::shared_ptr<const BackwardOp>>();
  return *r;
}

std::shared_ptr<const BackwardOp> find_backward(const c10::OperatorHandle& op) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto it = registry().find(op.schema().name());
  return it == registry().end() ? nullptr : it->second;
}

// The Python formula's kernel: AutogradOther over the same backend keys.
c10::DispatchKeySet formula_keys(c10::DispatchKeySet backend) {
  return backend | c10::DispatchKeySet(c10::DispatchKey::AutogradOther);
}

// The graph node of one call: its next edges are the arguments at BackwardOp::grads.
class OpNode : public torch::autograd::Node {
 public:
  OpNode(c10::OperatorHandle op, std::shared_ptr<const BackwardOp> bwd, c10::DispatchKeySet backend,
         std::vector<c10::IValue> args)
      : op_(std::move(op)), bwd_(std::move(bwd)), backend_(backend), args_(std::move(args)) {
    // Tensors are kept as SavedVariables (version-checked, released after the backward), the
    // other arguments as they are.
    for (size_t i = 0; i < args_.size(); ++i) {
      if (args_[i].isTensor() && args_[i].toTensor().defined()) {
        saved_.emplace_back(i, torch::autograd::SavedVariable(args_[i].toTensor(), /*is_output=*/false));
        args_[i] = c10::IValue();
      }
    }
  }

  std::string name() const override { return "OpbridgeBackward[" + op_.schema().name() + "]"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& s : saved_) s.second.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    std::vector<c10::IValue> args;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      args = args_;
      for (const auto& s : saved_) args[s.first] = s.second.unpack(getptr());
    }
    for (size_t k = 0; k < grads.size(); ++k) {
      if (!grads[k].defined()) grads[k] = input_metadata(k).zeros_like();
    }
    variable_list out(num_outputs());
    if (at::GradMode::is_enabled()) {
      differentiable_backward(args, grads, &out);
      return out;
    }
    torch::jit::Stack stack;
    stack.reserve(grads.size() + args.size());
    for (const auto& g : grads) stack.emplace_back(g);
    for (auto& a : args) stack.push_back(std::move(a));
    bwd_->op.callBoxed(&stack);
    std::vector<at::Tensor> got;
    for (const c10::IValue& v : stack) {
      if (v.isTuple()) {
        for (const c10::IValue& e : v.toTupleRef().elements()) got.push_back(e.isTensor() ? e.toTensor() : at::Tensor());
      } else {
        got.push_back(v.isTensor() ? v.toTensor() : at::Tensor());
      }
    }
    TORCH_CHECK(got.size() == out.size(), bwd_->op.schema().name(), " returned ", got.size(),
                " gradients; ", op_.schema().name(), "'s registration expects ", out.size());
    for (size_t j = 0; j < out.size(); ++j) {
      if (should_compute_output(j)) out[j] = std::move(got[j]);
    }
    return out;
  }

 private:
  // create_graph: the op again, through its Python formula, differentiated with a graph.
  void differentiable_backward(const std::vector<c10::IValue>& args, const variable_list& grads,
                               variable_list* out) {
    variable_list wanted;
    std::vector<size_t> where;
    for (size_t j = 0; j < out->size(); ++j) {
      const c10::IValue& a = args[static_cast<size_t>(bwd_->grads[j])];
      if (should_compute_output(j) && a.isTensor() && a.toTensor().defined()) {
        wanted.push_back(a.toTensor());
        where.push_back(j);
      }
    }
    if (wanted.empty()) return;
    torch::jit::Stack stack(args.begin(), args.end());
    op_.redispatchBoxed(formula_keys(backend_), &stack);
    variable_list outputs;
    for (const c10::IValue& v : stack) {
      if (v.isTensor()) outputs.push_back(v.toTensor());
    }
    const variable_list got = torch::autograd::grad(outputs, wanted, grads, /*retain_graph=*/true,
                                                    /*create_graph=*/true, /*allow_unused=*/true);
    for (size_t k = 0; k < where.size(); ++k) (*out)[where[k]] = got[k];
  }

  c10::OperatorHandle op_;
  std::shared_ptr<const BackwardOp> bwd_;
  c10::DispatchKeySet backend_;
  std::vector<c10::IValue> args_;
  std::vector<std::pair<size_t, torch::autograd::SavedVariable>> saved_;
};

void autograd_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const size_t num_args = op.schema().arguments().size();
  const c10::DispatchKeySet backend = ks & c10::after_autograd_keyset;
  TORCH_CHECK_NOT_IMPLEMENTED(!any_forward_grad(*stack, num_args), op.schema().name(),
                              ": forward-mode AD is not implemented (an argument is a dual tensor of "
                              "torch.autograd.forward_ad; the result would carry no tangent)");
  if (!at::GradMode::is_enabled() || !any_requires_grad(*stack, num_args)) {
    at::AutoDispatchBelowAutograd below;
    op.redispatchBoxed(backend, stack);
    return;
  }
  const std::shared_ptr<const BackwardOp> bwd = find_backward(op);
  if (bwd == nullptr) {
    op.redispatchBoxed(formula_keys(backend), stack);
    return;
  }
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  torch::autograd::edge_list edges;
  for (const int64_t i : bwd->grads) {
    const c10::IValue& a = args[static_cast<size_t>(i)];
    edges.push_back(a.isTensor() && a.toTensor().defined() ? torch::autograd::impl::gradient_edge(a.toTensor())
                                                           : torch::autograd::Edge());
  }
  auto node = make_node<OpNode>(op, bwd, backend, std::move(args));
  node->set_next_edges(std::move(edges));
  {
    at::AutoDispatchBelowADInplaceOrView below;
    op.redispatchBoxed(backend, stack);
  }
  const size_t num_returns = op.schema().returns().size();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() && torch::autograd::isDifferentiableType(v.toTensor().scalar_type())) {
      torch::autograd::set_history(v.toTensor(), node);
    } else {
      node->add_input_metadata(torch::autograd::Node::undefined_input());
    }
  }
}

std::pair<std::string, std::string> split_qualname(const std::string& qualname, const char* who) {
  const size_t sep = qualname.find("::");
  TORCH_CHECK_VALUE(sep != std::string::npos && sep > 0 && sep + 2 < qualname.size(), who,
                    ": qualname must be 'namespace::op', got '", qualname, "'");
  TORCH_CHECK_VALUE(c10::Dispatcher::singleton().findSchema({qualname, ""}).has_value(), who,
                    ": qualname must name a defined op, got '", qualname, "'");
  return {qualname.substr(0, sep), qualname.substr(sep + 2)};
}

void install(const std::string& qualname) {
  static std::mutex mu;
  static std::set<std::string> done;
  // Registrations live as long as the process (released at exit they would race the
  // dispatcher's own teardown).
  static auto* libraries = new std::vector<torch::Library*>();
  std::lock_guard<std::mutex> lock(mu);
  if (done.count(qualname) != 0) return;
  const auto [ns, name] = split_qualname(qualname, "opbridge::_no_grad_fast_path");
  for (const c10::DispatchKey key : {c10::DispatchKey::AutogradCPU, c10::DispatchKey::AutogradCUDA}) {
    auto* lib = new torch::Library(torch::Library::IMPL, ns, key, __FILE__, __LINE__);
    lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&autograd_kernel>());
    libraries->push_back(lib);
  }
  done.insert(qualname);
}

bool is_tensor_argument(const c10::Argument& a) {
  const c10::TypePtr& t = a.type();
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (t->kind() == c10::TypeKind::OptionalType) {
    return t->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType;
  }
  return false;
}

// Records that `backward` computes qualname's first-order gradients (see BackwardOp) and installs
// the kernel; the op's Python formula must be registered already (it serves create_graph).
void register_backward(const std::string& qualname, const std::string& backward, const std::vector<int64_t>& grads) {
  constexpr const char* who = "opbridge::_cpp_autograd";
  split_qualname(qualname, who);
  split_qualname(backward, who);
  const c10::OperatorHandle op = *c10::Dispatcher::singleton().findSchema({qualname, ""});
  const c10::OperatorHandle bwd = *c10::Dispatcher::singleton().findSchema({backward, ""});
  const auto& args = op.schema().arguments();
  TORCH_CHECK_VALUE(!grads.empty(), who, ": grads must name at least one argument of ", qualname);
  for (const int64_t i : grads) {
    TORCH_CHECK_VALUE(i >= 0 && i < static_cast<int64_t>(args.size()) && is_tensor_argument(args[static_cast<size_t>(i)]),
                      who, ": grads must be indices of ", qualname, "'s Tensor arguments, got ", i);
  }
  for (const auto& a : args) {
    TORCH_CHECK_VALUE(a.type()->kind() != c10::TypeKind::ListType, who, ": ", qualname,
                      " has a list argument (", a.name(), "), which the C++ autograd does not handle");
  }
  const size_t want = op.schema().returns().size() + args.size();
  TORCH_CHECK_VALUE(bwd.schema().arguments().size() == want, who, ": backward must take the gradients of ",
                    qualname, "'s ", op.schema().returns().size(), " outputs and then its ", args.size(),
                    " arguments (", want, " in all); ", backward, " takes ", bwd.schema().arguments().size());
  TORCH_CHECK_VALUE(bwd.schema().returns().size() == grads.size(), who, ": ", backward, " returns ",
                    bwd.schema().returns().size(), " values; grads names ", grads.size(), " arguments");
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry()[op.schema().name()] = std::make_shared<const BackwardOp>(BackwardOp{bwd, grads});
  }
  install(qualname);
}

}  // namespace

// Called by opbridge.ops (register_formula, register_autograd(backward_op=...)).
TORCH_LIBRARY_FRAGMENT(opbridge, m) {
  m.def("_no_grad_fast_path(str qualname) -> ()", &install);
  m.def("_cpp_autograd(str qualname, str backward, int[] grads) -> ()", &register_backward);
}
