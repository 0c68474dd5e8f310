// The registry of compute functions (opbridge/kernel.h).
#include "opbridge/kernel.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace opbridge {

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

int64_t KernelCall::index_of(std::string_view name) const {
  const int64_t i = decl().input_index(name);
  // A misspelled name in a compute function is a bug of the op, found by its first call.
  if (i < 0) throw std::invalid_argument("op " + decl().name() + " has no input named '" + std::string(name) + "'");
  return i;
}

std::string KernelSizedOutputs::allocate(size_t i, const std::vector<int64_t>& shape) {
  const OpDecl& d = call_.decl();
  std::string why = i < d.outputs().size() ? check_kernel_shape(d, i, output_shape(call_, i), shape)
                                           : "output " + std::to_string(i) + " is not declared";
  if (why.empty() && ((allocated_ >> i) & 1)) why = "output " + d.outputs()[i].name + " is allocated twice";
  if (!why.empty()) return "the compute function's " + why;
  allocated_ |= uint64_t{1} << i;
  return {};
}

std::string KernelSizedOutputs::missing() const {
  const OpDecl& d = call_.decl();
  for (size_t o = 0; o < d.outputs().size(); ++o) {
    if (sized_by_kernel(d, o) && !((allocated_ >> o) & 1)) {
      return "the compute function returned without allocating output " + d.outputs()[o].name +
             " (KernelCall::out(i, shape))";
    }
  }
  return {};
}

namespace {

struct Registry {
  std::vector<OpKernel> kernels;
  std::vector<std::pair<void (*)(const OpKernel&, void*), void*>> listeners;
};

// Constructed on first use: registrations run during static initialization, in an order C++
// leaves open.
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: read until the library unloads
  return *r;
}

}  // namespace

void register_kernel(const OpKernel& kernel) {
  Registry& r = registry();
  r.kernels.push_back(kernel);
  for (const auto& [fn, ctx] : r.listeners) fn(kernel, ctx);
}

const std::vector<OpKernel>& registered_kernels() { return registry().kernels; }

void on_kernel(void (*fn)(const OpKernel& kernel, void* ctx), void* ctx) {
  Registry& r = registry();
  r.listeners.emplace_back(fn, ctx);
  // By index: fn may register nothing, but must not be surprised by a growing vector either.
  for (size_t i = 0; i < r.kernels.size(); ++i) fn(r.kernels[i], ctx);
}

bool in_library(const OpKernel& kernel, const char* library) {
  return library == nullptr || std::strcmp(kernel.library, library) == 0;
}

}  // namespace opbridge
