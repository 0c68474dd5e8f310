// group_norm_backward_direct: calls opbridge's framework-free GroupNorm backward kernel
// (opbridge::kernels) with no framework at all, on float32 .npy files, once with dx and once
// without (dx = nullptr: dweight and dbias only, a path of the C++ API that no framework uses).
//
//   group_norm_backward_direct <x.npy> <weight.npy> <bias.npy> <dy.npy> <num_groups> <eps>
//                              <nchw|nhwc> <none|silu> <ranges> <out_dir>
//
// nhwc: x.npy and dy.npy hold [N, spatial..., C] (channels-last memory); dx is written the same
// way. ranges: the parallel-for splits every loop into this many ranges (at least its grain) and
// runs them one after the other, last first, as a thread pool might. Writes <out_dir>/0.npy dx,
// 1.npy dweight, 2.npy dbias, 3.npy dweight and 4.npy dbias of the call without dx, 5.npy dx
// computed in place over a copy of dy, and 6.npy over a copy of x (the API allows both) with 7.npy
// dx from the same x not in place (x's alignment can change the order of the statistics' sums,
// so both copies of x are 64-byte aligned).
#include <opbridge/group_norm.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "npy.h"

namespace {

void run_ranges(void* self, int64_t n, int64_t grain, opbridge::ParallelFor::Body body, void* ctx) {
  const int64_t want = *static_cast<const int64_t*>(self);
  const int64_t ranges = std::max<int64_t>(1, std::min(want, n / grain));
  const int64_t per = (n + ranges - 1) / ranges;
  for (int64_t r = ranges - 1; r >= 0; --r) {
    const int64_t b = r * per, e = std::min(n, b + per);
    if (b < e) body(ctx, b, e);
  }
}

const float* f32(const npy::Array& a) { return reinterpret_cast<const float*>(a.data.data()); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 11) {
    std::fprintf(stderr,
                 "usage: group_norm_backward_direct <x.npy> <weight.npy> <bias.npy> <dy.npy> <num_groups> <eps> "
                 "<nchw|nhwc> <none|silu> <ranges> <out_dir>\n");
    return 2;
  }
  try {
    const npy::Array x = npy::read(argv[1]), w = npy::read(argv[2]), b = npy::read(argv[3]),
                     dy = npy::read(argv[4]);
    for (const npy::Array* a : {&x, &w, &b, &dy}) {
      if (a->descr != "<f4") throw std::runtime_error("expected float32 arrays, got " + a->descr);
    }
    if (dy.shape != x.shape) throw std::runtime_error("dy must have x's shape");
    const int64_t groups = std::atoll(argv[5]);
    const double eps = std::atof(argv[6]);
    const std::string layout = argv[7], activation = argv[8], out = argv[10];
    if (layout != "nchw" && layout != "nhwc") throw std::runtime_error("layout must be nchw or nhwc");
    if (activation != "none" && activation != "silu") throw std::runtime_error("activation must be none or silu");
    const bool nhwc = layout == "nhwc";
    const opbridge::Activation act = activation == "silu" ? opbridge::Activation::kSilu : opbridge::Activation::kNone;
    int64_t ranges = std::atoll(argv[9]);
    // The logical shape [N, C, spatial...] of the file's [N, spatial..., C] when nhwc.
    std::vector<int64_t> shape = x.shape;
    if (nhwc && shape.size() > 2) {
      shape.insert(shape.begin() + 1, shape.back());
      shape.pop_back();
    }
    const opbridge::GroupNormDims d = opbridge::group_norm_dims(shape.data(), shape.size(), groups, nhwc);
    const opbridge::ParallelFor pf(run_ranges, &ranges);
    const size_t C = static_cast<size_t>(d.C);
    std::vector<float> dx(static_cast<size_t>(x.numel())), dw(C), db(C), dw2(C), db2(C);
    opbridge::Status st = opbridge::group_norm_backward_cpu<float>(f32(dy), f32(x), f32(w), f32(b), dx.data(),
                                                                   dw.data(), db.data(), d, eps, act, pf);
    if (!st.ok()) throw std::runtime_error(st.message());
    st = opbridge::group_norm_backward_cpu<float>(f32(dy), f32(x), f32(w), f32(b), nullptr, dw2.data(), db2.data(),
                                                  d, eps, act, pf);
    if (!st.ok()) throw std::runtime_error(st.message());
    std::vector<float> over_dy(f32(dy), f32(dy) + x.numel());
    st = opbridge::group_norm_backward_cpu<float>(over_dy.data(), f32(x), f32(w), f32(b), over_dy.data(), nullptr,
                                                  nullptr, d, eps, act, pf);
    if (!st.ok()) throw std::runtime_error(st.message());
    const size_t n = static_cast<size_t>(x.numel()), bytes = (n * sizeof(float) + 63) / 64 * 64;
    const auto aligned_copy_of_x = [&] {
      std::unique_ptr<float, decltype(&std::free)> p(static_cast<float*>(std::aligned_alloc(64, bytes)), &std::free);
      if (p == nullptr) throw std::runtime_error("out of memory");
      std::copy(f32(x), f32(x) + n, p.get());
      return p;
    };
    const auto x_aligned = aligned_copy_of_x(), over_x = aligned_copy_of_x();
    std::vector<float> dx_aligned(n);
    st = opbridge::group_norm_backward_cpu<float>(f32(dy), x_aligned.get(), f32(w), f32(b), dx_aligned.data(),
                                                  nullptr, nullptr, d, eps, act, pf);
    if (!st.ok()) throw std::runtime_error(st.message());
    st = opbridge::group_norm_backward_cpu<float>(f32(dy), over_x.get(), f32(w), f32(b), over_x.get(), nullptr,
                                                  nullptr, d, eps, act, pf);
    if (!st.ok()) throw std::runtime_error(st.message());
    const std::vector<int64_t> cs{d.C};
    npy::write(out + "/0.npy", "<f4", x.shape, dx.data(), dx.size() * sizeof(float));
    npy::write(out + "/1.npy", "<f4", cs, dw.data(), C * sizeof(float));
    npy::write(out + "/2.npy", "<f4", cs, db.data(), C * sizeof(float));
    npy::write(out + "/3.npy", "<f4", cs, dw2.data(), C * sizeof(float));
    npy::write(out + "/4.npy", "<f4", cs, db2.data(), C * sizeof(float));
    npy::write(out + "/5.npy", "<f4", x.shape, over_dy.data(), over_dy.size() * sizeof(float));
    npy::write(out + "/6.npy", "<f4", x.shape, over_x.get(), n * sizeof(float));
    npy::write(out + "/7.npy", "<f4", x.shape, dx_aligned.data(), n * sizeof(float));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
