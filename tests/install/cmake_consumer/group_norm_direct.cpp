// group_norm_direct: calls opbridge's framework-free GroupNorm kernel (opbridge::kernels) with
// no framework at all, on .npy files (float16, float32 or float64; weight and bias of x's type).
//
//   group_norm_direct <x.npy> <weight.npy> <bias.npy> <num_groups> <eps> <y.npy>
//                     [<mean.npy> <rstd.npy> [channels_last]]
//
// With mean.npy and rstd.npy, also the kernel's per-group statistics (the C++ API's optional
// mean / rstd outputs, [N, G] in the accumulation type: float64 for float64 x, float32
// otherwise), which neither torch nor ORT asks for. channels_last: x (and y) are (N, *spatial, C).
// The instruction-set variant is the process-wide level (environment variable OPBRIDGE_CPU_ISA).
#include <opbridge/group_norm.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "npy.h"

namespace {

template <class T>
void run(const npy::Array& x, const npy::Array& w, const npy::Array& b, const opbridge::GroupNormDims& d, double eps,
         int argc, char** argv) {
  using A = opbridge::acc_t<T>;
  std::vector<T> y(static_cast<size_t>(x.numel()));
  const bool stats = argc >= 9;
  const size_t ng = stats ? static_cast<size_t>(d.N * d.G) : 0;
  std::vector<A> mean(ng), rstd(ng);
  // Serial ParallelFor: this program has no thread pool to offer.
  const opbridge::Status st = opbridge::group_norm_cpu<T>(
      reinterpret_cast<const T*>(x.data.data()), reinterpret_cast<const T*>(w.data.data()),
      reinterpret_cast<const T*>(b.data.data()), y.data(), d, eps, opbridge::Activation::kNone,
      stats ? mean.data() : nullptr, stats ? rstd.data() : nullptr, opbridge::ParallelFor());
  if (!st.ok()) throw std::runtime_error(st.message());
  npy::write(argv[6], x.descr, x.shape, y.data(), y.size() * sizeof(T));
  if (stats) {
    const std::string acc = sizeof(A) == 8 ? "<f8" : "<f4";
    npy::write(argv[7], acc, {d.N, d.G}, mean.data(), ng * sizeof(A));
    npy::write(argv[8], acc, {d.N, d.G}, rstd.data(), ng * sizeof(A));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7 && argc != 9 && argc != 10) {
    std::fprintf(stderr, "usage: group_norm_direct <x.npy> <weight.npy> <bias.npy> <num_groups> <eps> <y.npy> "
                         "[<mean.npy> <rstd.npy> [channels_last]]\n");
    return 2;
  }
  try {
    const npy::Array x = npy::read(argv[1]), w = npy::read(argv[2]), b = npy::read(argv[3]);
    if (x.descr != "<f2" && x.descr != "<f4" && x.descr != "<f8") {
      throw std::runtime_error("expected a float16, float32 or float64 x, got " + x.descr);
    }
    for (const npy::Array* a : {&w, &b}) {
      if (a->descr != x.descr) throw std::runtime_error("weight and bias must have x's type " + x.descr);
    }
    const int64_t groups = std::atoll(argv[4]);
    const double eps = std::atof(argv[5]);
    const bool channels_last = argc == 10 && std::strcmp(argv[9], "channels_last") == 0;
    // The logical (N, C, *spatial) shape: a channels-last x is (N, *spatial, C) in the file.
    std::vector<int64_t> shape = x.shape;
    if (channels_last && shape.size() >= 2) {
      shape = {x.shape.front(), x.shape.back()};
      shape.insert(shape.end(), x.shape.begin() + 1, x.shape.end() - 1);
    }
    const opbridge::ElemType type = x.descr == "<f2"   ? opbridge::ElemType::kFloat16
                                    : x.descr == "<f4" ? opbridge::ElemType::kFloat32
                                                       : opbridge::ElemType::kFloat64;
    // The op's own checks, from its declaration (the same torch and ORT run).
    opbridge::OpCall call(opbridge::group_norm_decl());
    for (const char* name : {"x", "weight", "bias"}) {
      const npy::Array& a = name[0] == 'x' ? x : name[0] == 'w' ? w : b;
      opbridge::TensorArg& t = call.in(name);
      t.present = true;
      t.type = type;
      t.shape = name[0] == 'x' ? shape : a.shape;
    }
    call.set_int("num_groups", groups);
    call.set_float("eps", eps);
    const opbridge::Status st = opbridge::check_call(call);
    if (!st.ok()) throw std::runtime_error(st.message());
    const opbridge::GroupNormDims d = opbridge::group_norm_dims(shape.data(), shape.size(), groups, channels_last);
    if (type == opbridge::ElemType::kFloat16) {
      run<opbridge::Half>(x, w, b, d, eps, argc, argv);
    } else if (type == opbridge::ElemType::kFloat32) {
      run<float>(x, w, b, d, eps, argc, argv);
    } else {
      run<double>(x, w, b, d, eps, argc, argv);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
