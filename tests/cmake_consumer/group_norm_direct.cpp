// group_norm_direct: calls opbridge's framework-free GroupNorm kernel (opbridge::kernels) with
// no framework at all, on float32 .npy files.
//
//   group_norm_direct <x.npy> <weight.npy> <bias.npy> <num_groups> <eps> <y.npy>
#include <opbridge/group_norm.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "npy.h"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: group_norm_direct <x.npy> <weight.npy> <bias.npy> <num_groups> <eps> <y.npy>\n");
    return 2;
  }
  try {
    const npy::Array x = npy::read(argv[1]), w = npy::read(argv[2]), b = npy::read(argv[3]);
    for (const npy::Array* a : {&x, &w, &b}) {
      if (a->descr != "<f4") throw std::runtime_error("expected float32 arrays, got " + a->descr);
    }
    const int64_t groups = std::atoll(argv[4]);
    const double eps = std::atof(argv[5]);
    // The op's own checks, from its declaration (the same torch and ORT run).
    opbridge::OpCall call(opbridge::group_norm_decl());
    for (const char* name : {"x", "weight", "bias"}) {
      const npy::Array& a = name[0] == 'x' ? x : name[0] == 'w' ? w : b;
      opbridge::TensorArg& t = call.in(name);
      t.present = true;
      t.type = opbridge::ElemType::kFloat32;
      t.shape = a.shape;
    }
    call.set_int("num_groups", groups);
    call.set_float("eps", eps);
    opbridge::Status st = opbridge::check_call(call);
    if (!st.ok()) throw std::runtime_error(st.message());
    const opbridge::GroupNormDims d =
        opbridge::group_norm_dims(x.shape.data(), x.shape.size(), groups, /*channels_last=*/false);
    std::vector<float> y(static_cast<size_t>(x.numel()));
    // Serial ParallelFor: this program has no thread pool to offer.
    st = opbridge::group_norm_cpu<float>(reinterpret_cast<const float*>(x.data.data()),
                                         reinterpret_cast<const float*>(w.data.data()),
                                         reinterpret_cast<const float*>(b.data.data()), y.data(), d, eps,
                                         opbridge::Activation::kNone, nullptr, nullptr, opbridge::ParallelFor());
    if (!st.ok()) throw std::runtime_error(st.message());
    npy::write(argv[6], "<f4", x.shape, y.data(), y.size() * sizeof(float));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
