// torch ops shapes::select_rows and select_rows_backward: schemas and checks from the declarations
// (select_rows_decl.cpp), CPU implementations here, on the LibTorch stable ABI: the library built from
// this loads into every torch from the release opbridge targets on (opbridge_TORCH_TARGET). The
// fake kernels come from the declarations too, the autograd formula from the Python package
// (ops/select_rows.py).
#include <opbridge/torch/torch_common.h>

#include <vector>

#include "select_rows.h"

namespace shapes {
namespace {

using namespace opbridge::torch_adapter;

// The declaration's checks have passed when this runs (OPBRIDGE_DECLARED_KERNEL).
void select_rows_cpu_impl(TorchCall& c) {
  const Tensor xc = contiguous(c.in("x"));
  const int64_t rows = c.call().in("x").dim(0), channels = c.call().in("x").dim(1);
  std::vector<uint8_t> keep(static_cast<size_t>(rows));
  c.check(opbridge::dispatch<float, double>(c.call().in("x").type, [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = select_rows_count<T>(ptr<T>(xc), rows, channels, c.call().attr_float("threshold"), keep.data());
    Tensor y = empty({n, channels}, dtype(xc), xc);
    select_rows_copy<T>(ptr<T>(xc), keep.data(), rows, channels, mutable_ptr<T>(y));
    c.set_output(0, std::move(y));
    return opbridge::Status::Ok();
  }));
}

}  // namespace

OPBRIDGE_TORCH_LIBRARY_FRAGMENT(m) {
  define_op(m, select_rows_decl());
}

OPBRIDGE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("select_rows", OPBRIDGE_DECLARED_KERNEL(select_rows_decl, select_rows_cpu_impl));
}

}  // namespace shapes
