// opbridge's CUDA launchers timed without torch or Python: the kernel files are compiled into this
// program directly (benchmarks/cuda/build.sh), so a kernel change rebuilds in seconds on a GPU
// machine (only the changed file), and every figure stands next to a device-to-device copy of the
// same bytes measured in the same run.
//
//   kernel_bench [gn] [inverse] [msda] [--iters N]      (default: all three, 20 iterations)
//
// Times are CUDA events around one launcher call, the median of N calls after a warm-up; each
// case also checks a sample of its output against a float64 reference computed here, so a fast
// wrong answer cannot pass (exit status 1). Shapes: those of benchmarks/benchmarks/bench_cuda.py.
//   gn       GroupNorm, fp32/fp16/bf16, contiguous and channels_last, with and without SiLU:
//            us, GB/s (one read + one write), and the fraction of a copy's bandwidth
//   inverse  Inverse, fp32/fp64, on_singular "nan" (no read-back): us per call
//   msda     MultiScaleDeformableAttention forward and backward, DETR encoder/decoder shapes
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ops/group_norm/group_norm.cuh"
#include "ops/inverse/inverse.cuh"
#include "ops/ms_deform_attn/ms_deform_attn.cuh"
#include "opbridge/dtype.h"

namespace {

using opbridge::BFloat16;
using opbridge::Half;

int g_iters = 20;
bool g_failed = false;

#define CHECK(call)                                                                                \
  do {                                                                                             \
    const cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

template <class T> T from_f(double v) { return static_cast<T>(v); }
template <> Half from_f<Half>(double v) { return Half{opbridge::float_to_half(static_cast<float>(v))}; }
template <> BFloat16 from_f<BFloat16>(double v) { return BFloat16{opbridge::float_to_bf16(static_cast<float>(v))}; }
template <class T> double to_f(T v) { return static_cast<double>(v); }
template <> double to_f<Half>(Half v) { return opbridge::half_to_float(v.bits); }
template <> double to_f<BFloat16>(BFloat16 v) { return opbridge::bf16_to_float(v.bits); }
template <class T> const char* name();
template <> const char* name<float>() { return "fp32"; }
template <> const char* name<double>() { return "fp64"; }
template <> const char* name<Half>() { return "fp16"; }
template <> const char* name<BFloat16>() { return "bf16"; }

template <class T>
struct Device {
  T* p = nullptr;
  size_t n = 0;
  explicit Device(size_t count) : n(count) { CHECK(cudaMalloc(&p, std::max<size_t>(1, count) * sizeof(T))); }
  ~Device() { cudaFree(p); }
  Device(const Device&) = delete;
  void put(const std::vector<T>& h) { CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// Median time in microseconds of `iters` calls of fn on `stream`, after two warm-up calls.
double median_us(cudaStream_t stream, const std::function<cudaError_t()>& fn) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) CHECK(fn());
  std::vector<float> ms;
  for (int i = 0; i < g_iters; ++i) {
    CHECK(cudaEventRecord(a, stream));
    CHECK(fn());
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CHECK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2];
}

template <class T>
std::vector<T> random_host(size_t n, std::mt19937_64& rng, double scale, double offset) {
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<T> h(n);
  for (auto& v : h) v = from_f<T>(d(rng) * scale + offset);
  return h;
}

void report_check(const char* what, double err, double tol) {
  if (!(err <= tol)) {
    std::printf("  WRONG %s: max error %.3g > %.3g\n", what, err, tol);
    g_failed = true;
  }
}

// ---- GroupNorm ----------------------------------------------------------------------------------

struct GnShape {
  const char* label;
  int64_t N, C, S, G;
};

template <class T>
void bench_gn(cudaStream_t stream, const GnShape& sh, std::mt19937_64& rng) {
  const size_t n = static_cast<size_t>(sh.N * sh.C * sh.S);
  std::vector<T> hx = random_host<T>(n, rng, 2.0, 0.5), hw = random_host<T>(sh.C, rng, 1.0, 0.0),
                 hb = random_host<T>(sh.C, rng, 1.0, 0.0);
  Device<T> x(n), y(n), w(sh.C), b(sh.C), copy(n);
  x.put(hx);
  w.put(hw);
  b.put(hb);
  const double bytes = 2.0 * n * sizeof(T);
  const double copy_us = median_us(stream, [&] {
    return cudaMemcpyAsync(copy.p, x.p, n * sizeof(T), cudaMemcpyDeviceToDevice, stream);
  });
  for (int cl = 0; cl < 2; ++cl) {
    opbridge::GroupNormDims d;
    d.N = sh.N;
    d.C = sh.C;
    d.S = sh.S;
    d.G = sh.G;
    d.channels_last = cl == 1;
    const size_t ws_bytes = opbridge::cuda::group_norm_workspace_bytes<T>(d);
    Device<unsigned char> ws(ws_bytes);
    for (int act = 0; act < 2; ++act) {
      const auto a = static_cast<opbridge::Activation>(act);
      opbridge::GroupNormParams p;
      p.d = d;
      p.eps = 1e-5;
      p.act = a;
      const double us = median_us(stream, [&] {
        return opbridge::cuda::launch_group_norm<T>(stream, x.p, w.p, b.p, y.p, p, ws_bytes ? ws.p : nullptr, ws_bytes);
      });
      std::printf("gn %-22s %s %-13s %-4s %9.1f us %7.0f GB/s  copy %8.1f us  fraction %.2f\n", sh.label,
                  name<T>(), cl ? "channels_last" : "contiguous", act ? "silu" : "none", us, bytes / us * 1e-3, copy_us,
                  copy_us / us);
      // Check three groups (first, middle, last) against float64.
      const std::vector<T> hy = y.get();
      const int64_t cg = sh.C / sh.G;
      double err = 0, scale = 1;
      for (int64_t ng : {int64_t{0}, sh.N * sh.G / 2, sh.N * sh.G - 1}) {
        const int64_t nn = ng / sh.G, g = ng % sh.G;
        auto at = [&](int64_t c, int64_t s) -> size_t {
          return static_cast<size_t>(cl ? (nn * sh.S + s) * sh.C + c : (nn * sh.C + c) * sh.S + s);
        };
        double mean = 0, var = 0;
        for (int64_t c = g * cg; c < (g + 1) * cg; ++c)
          for (int64_t s = 0; s < sh.S; ++s) mean += to_f(hx[at(c, s)]);
        mean /= static_cast<double>(cg * sh.S);
        for (int64_t c = g * cg; c < (g + 1) * cg; ++c)
          for (int64_t s = 0; s < sh.S; ++s) var += (to_f(hx[at(c, s)]) - mean) * (to_f(hx[at(c, s)]) - mean);
        const double rstd = 1.0 / std::sqrt(var / static_cast<double>(cg * sh.S) + 1e-5);
        for (int64_t c = g * cg; c < (g + 1) * cg; ++c) {
          for (int64_t s = 0; s < sh.S; ++s) {
            double v = (to_f(hx[at(c, s)]) - mean) * rstd * to_f(hw[c]) + to_f(hb[c]);
            if (act) v = v / (1.0 + std::exp(-v));
            err = std::max(err, std::fabs(to_f(hy[at(c, s)]) - v));
            scale = std::max(scale, std::fabs(v));
          }
        }
      }
      const double tol = (sizeof(T) == 2 ? (std::is_same_v<T, Half> ? 3e-3 : 2e-2) : 3e-5) * scale;
      report_check("group_norm", err, tol);
    }
  }
}

void run_gn(cudaStream_t stream) {
  // bench_cuda.py's GN_SHAPES (spatial dims flattened).
  const GnShape shapes[] = {
      {"1x64x56x56/G32", 1, 64, 56 * 56, 32},       {"8x256x32x32/G32", 8, 256, 32 * 32, 32},
      {"2x512x64x64/G32", 2, 512, 64 * 64, 32},     {"16x512x64x64/G32", 16, 512, 64 * 64, 32},
      {"8x512x128x128/G32", 8, 512, 128 * 128, 32}, {"16x512x128x128/G32", 16, 512, 128 * 128, 32},
      {"2x320x64x64/G32", 2, 320, 64 * 64, 32},     {"4x64x4096/G1", 4, 64, 4096, 1},
      {"64x32x8/G32", 64, 32, 8, 32},
  };
  std::mt19937_64 rng(1);
  for (const GnShape& s : shapes) {
    bench_gn<float>(stream, s, rng);
    bench_gn<Half>(stream, s, rng);
    bench_gn<BFloat16>(stream, s, rng);
  }
}

// ---- Inverse ------------------------------------------------------------------------------------

template <class T>
void bench_inverse(cudaStream_t stream, int64_t batch, int64_t n, std::mt19937_64& rng) {
  std::vector<T> ha = random_host<T>(static_cast<size_t>(batch * n * n), rng, 1.0, 0.0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i) ha[static_cast<size_t>((b * n + i) * n + i)] += T(2 * std::sqrt(double(n)));
  Device<T> a(ha.size()), y(ha.size());
  Device<uint64_t> info(1);
  a.put(ha);
  const size_t ws_bytes = opbridge::cuda::inverse_workspace_bytes<T>(batch, n);
  Device<unsigned char> ws(ws_bytes);
  const double us = median_us(stream, [&] {
    return opbridge::cuda::launch_inverse<T>(stream, a.p, y.p, batch, n, info.p, ws_bytes ? ws.p : nullptr, ws_bytes,
                                             true);
  });
  std::printf("inverse %7lldx%-4lld %s %10.1f us  %8.3f us/matrix\n", static_cast<long long>(batch),
              static_cast<long long>(n), name<T>(), us, us / static_cast<double>(batch));
  // Residual |A X - I| of the first and last matrix.
  const std::vector<T> hy = y.get();
  double err = 0;
  for (int64_t b : {int64_t{0}, batch - 1}) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t k = 0; k < n; ++k) s += to_f(ha[(b * n + i) * n + k]) * to_f(hy[(b * n + k) * n + j]);
        err = std::max(err, std::fabs(s - (i == j ? 1.0 : 0.0)));
      }
    }
  }
  report_check("inverse", err, std::is_same_v<T, float> ? 1e-3 : 1e-10);
}

void run_inverse(cudaStream_t stream) {
  const int64_t cases[][2] = {{100000, 4}, {10000, 3}, {32768, 2}, {1024, 8},  {4096, 16},
                              {1024, 32},  {1024, 64}, {64, 128},  {64, 256}, {16, 512}};
  std::mt19937_64 rng(2);
  for (const auto& c : cases) {
    bench_inverse<float>(stream, c[0], c[1], rng);
    bench_inverse<double>(stream, c[0], c[1], rng);
  }
}

// ---- MultiScaleDeformableAttention --------------------------------------------------------------

template <class T>
void bench_msda(cudaStream_t stream, const char* label, int64_t n, int64_t lq, std::mt19937_64& rng) {
  const std::vector<int64_t> shapes = {64, 64, 32, 32, 16, 16, 8, 8};
  const std::vector<int64_t> starts = {0, 4096, 5120, 5376};
  opbridge::MsDeformAttnDims d;
  d.N = n;
  d.S = 5440;
  d.M = 8;
  d.D = 32;
  d.Lq = lq < 0 ? d.S : lq;
  d.L = 4;
  d.P = 4;
  const size_t nv = static_cast<size_t>(d.N * d.S * d.M * d.D), nw = static_cast<size_t>(d.N * d.Lq * d.M * 16),
               no = static_cast<size_t>(d.N * d.Lq * d.M * d.D);
  std::uniform_real_distribution<double> u(-0.1, 1.1), uw(0.0, 1.0);
  std::vector<T> hv = random_host<T>(nv, rng, 1.0, 0.0), hl(2 * nw), ha(nw), hg = random_host<T>(no, rng, 1.0, 0.0);
  for (auto& v : hl) v = from_f<T>(u(rng));
  for (auto& v : ha) v = from_f<T>(uw(rng));
  Device<T> value(nv), loc(2 * nw), attn(nw), out(no), gout(no), gv(nv), gl(2 * nw), ga(nw);
  value.put(hv);
  loc.put(hl);
  attn.put(ha);
  gout.put(hg);
  const size_t ws_bytes = opbridge::cuda::ms_deform_attn_backward_workspace_bytes<T>(d);
  Device<unsigned char> ws(ws_bytes);
  const double fwd = median_us(stream, [&] {
    return opbridge::cuda::launch_ms_deform_attn<T>(stream, value.p, shapes.data(), starts.data(), loc.p, attn.p,
                                                    out.p, d);
  });
  const double bwd = median_us(stream, [&] {
    return opbridge::cuda::launch_ms_deform_attn_backward<T>(stream, gout.p, value.p, shapes.data(), starts.data(),
                                                             loc.p, attn.p, gv.p, gl.p, ga.p, d,
                                                             ws_bytes ? ws.p : nullptr, ws_bytes);
  });
  std::printf("msda %-8s N=%lld Lq=%-5lld %s  forward %8.1f us  backward %8.1f us\n", label,
              static_cast<long long>(n), static_cast<long long>(d.Lq), name<T>(), fwd, bwd);
  // The forward of a few queries against float64 bilinear sampling (zero padding,
  // align_corners=False: pixel (x W - 0.5, y H - 0.5)).
  CHECK(opbridge::cuda::launch_ms_deform_attn<T>(stream, value.p, shapes.data(), starts.data(), loc.p, attn.p, out.p,
                                                 d));
  const std::vector<T> ho = out.get();
  double err = 0, scale = 1;
  for (int64_t q : {int64_t{0}, d.Lq / 2, d.Lq - 1}) {
    const int64_t b = d.N - 1;
    for (int64_t m = 0; m < d.M; ++m) {
      for (int64_t c = 0; c < d.D; ++c) {
        double acc = 0;
        for (int64_t l = 0; l < d.L; ++l) {
          const int64_t H = shapes[2 * l], W = shapes[2 * l + 1];
          for (int64_t p = 0; p < d.P; ++p) {
            const size_t wi = static_cast<size_t>((((b * d.Lq + q) * d.M + m) * d.L + l) * d.P + p);
            const double x = to_f(hl[2 * wi]) * W - 0.5, y = to_f(hl[2 * wi + 1]) * H - 0.5;
            const double x0 = std::floor(x), y0 = std::floor(y);
            double s = 0;
            for (int dy = 0; dy < 2; ++dy) {
              for (int dx = 0; dx < 2; ++dx) {
                const int64_t xi = static_cast<int64_t>(x0) + dx, yi = static_cast<int64_t>(y0) + dy;
                if (xi < 0 || yi < 0 || xi >= W || yi >= H) continue;
                const double wgt = (dx ? x - x0 : 1 - (x - x0)) * (dy ? y - y0 : 1 - (y - y0));
                s += wgt * to_f(hv[static_cast<size_t>(((b * d.S + starts[l] + yi * W + xi) * d.M + m) * d.D + c)]);
              }
            }
            acc += to_f(ha[wi]) * s;
          }
        }
        err = std::max(err, std::fabs(to_f(ho[static_cast<size_t>(((b * d.Lq + q) * d.M + m) * d.D + c)]) - acc));
        scale = std::max(scale, std::fabs(acc));
      }
    }
  }
  report_check("ms_deform_attn", err, (sizeof(T) == 2 ? (std::is_same_v<T, Half> ? 4e-3 : 3e-2) : 2e-5) * scale);
}

void run_msda(cudaStream_t stream) {
  std::mt19937_64 rng(3);
  for (int64_t batch : {2, 8}) {
    for (int64_t lq : {int64_t{-1}, int64_t{300}, int64_t{900}}) {
      const char* label = lq < 0 ? "encoder" : "decoder";
      bench_msda<float>(stream, label, batch, lq, rng);
      bench_msda<Half>(stream, label, batch, lq, rng);
      bench_msda<BFloat16>(stream, label, batch, lq, rng);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> which;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) {
      g_iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "gn" || a == "inverse" || a == "msda") {
      which.push_back(a);
    } else {
      std::fprintf(stderr, "usage: kernel_bench [gn] [inverse] [msda] [--iters N]\n");
      return 2;
    }
  }
  if (which.empty()) which = {"gn", "inverse", "msda"};
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, CUDA runtime %d; median of %d calls\n", prop.name, prop.multiProcessorCount, CUDART_VERSION,
              g_iters);
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const std::string& w : which) {
    if (w == "gn") run_gn(stream);
    if (w == "inverse") run_inverse(stream);
    if (w == "msda") run_msda(stream);
  }
  CHECK(cudaStreamDestroy(stream));
  if (g_failed) std::printf("SOME RESULTS WERE WRONG\n");
  return g_failed ? 1 : 0;
}
