// Host emulation of the channels_last GroupNorm CUDA kernels' work decomposition and per-thread
// math (ops/group_norm/group_norm_nhwc.cuh), for tests/cuda_ops/test_cuda_host.py on machines
// without a GPU. Runs the partial kernel's functions for every tile and thread, merges each
// unit's entries as a warp does, then the finalize and apply steps with the kernels' layouts
// (grid-stride loops over a small grid, so that the strides are exercised), and checks that
// the apply step writes every element exactly once.
//
//   gn_nhwc_host TYPE VEC GRID IN OUT     TYPE: float | double
// IN:  int64 N S C G act(0 none, 1 silu), float64 eps, float64 x[N*S*C], w[C], b[C]
// OUT: float64 y[N*S*C], then float64 mean[N*G], rstd[N*G]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace opbridge::cuda {
inline float to_acc(float v) { return v; }
inline double to_acc(double v) { return v; }
}  // namespace opbridge::cuda

#include "ops/group_norm/group_norm_nhwc.cuh"

using namespace opbridge::cuda;

namespace {

constexpr int kItems = 16;  // group_norm_kernel.cu's kItems

template <class T, int VEC>
int run(FILE* in, FILE* out, int64_t grid) {
  using A = T;
  int64_t h[5];
  double eps = 0;
  if (std::fread(h, sizeof(int64_t), 5, in) != 5 || std::fread(&eps, sizeof(double), 1, in) != 1) return 2;
  const int64_t N = h[0], S = h[1], C = h[2], G = h[3], act = h[4];
  const int64_t numel = N * S * C;
  std::vector<double> xd(numel), wd(C), bd(C);
  if (std::fread(xd.data(), 8, numel, in) != static_cast<size_t>(numel)) return 2;
  if (std::fread(wd.data(), 8, C, in) != static_cast<size_t>(C)) return 2;
  if (std::fread(bd.data(), 8, C, in) != static_cast<size_t>(C)) return 2;
  if ((C / G) % VEC != 0) return 3;
  // Exactly numel elements, 64-byte aligned: AddressSanitizer sees any access past the end.
  void* mem = nullptr;
  if (posix_memalign(&mem, 64, numel * sizeof(T)) != 0) return 1;
  T* x = static_cast<T*>(mem);
  for (int64_t i = 0; i < numel; ++i) x[i] = static_cast<T>(xd[i]);

  const NhwcPlan p = make_nhwc_plan(N, S, C, G);
  std::vector<A> partial(2 * p.N * p.K * p.U, std::nan(""));
  std::vector<int> partial_writes(p.N * p.K * p.U, 0);
  constexpr int kThreads = kNhwcBlock;
  std::vector<Moments<A>> sm(kThreads);
  for (int64_t t = 0; t < p.N * p.K * p.CBn; ++t) {
    const int64_t cb = t % p.CBn, nk = t / p.CBn;
    const int64_t k = nk % p.K, n = nk / p.K;
    const NhwcBlock b = nhwc_block(p, cb);
    const NhwcThreads th = nhwc_threads(b, VEC, kThreads);
    if (th.cols < 1 || th.cols > kThreads || b.width % VEC != 0) return 5;
    for (int tid = 0; tid < kThreads; ++tid) sm[tid] = nhwc_thread_moments<VEC, kItems, T, A>(x, p, b, th, n, k, tid);
    const int entries = nhwc_entries(b, th, VEC);
    for (int lu = 0; lu < b.units; ++lu) {
      // A warp: lane l merges entries l, l + 32, ...; then lanes are merged pairwise (shfl_down).
      Moments<A> lanes[32];
      for (int l = 0; l < 32; ++l) {
        lanes[l] = Moments<A>{0, 0, 0};
        for (int e = l; e < entries; e += 32) {
          const int tid = nhwc_entry_thread(b, th, VEC, lu, e);
          if (tid < 0 || tid >= th.cols * th.rpp) return 6;
          merge(lanes[l], sm[tid].n, sm[tid].mean, sm[tid].m2);
        }
      }
      for (int off = 16; off > 0; off >>= 1) {
        for (int l = 0; l + off < 32; ++l) merge(lanes[l], lanes[l + off].n, lanes[l + off].mean, lanes[l + off].m2);
      }
      const int64_t i = nhwc_partial_index(p, n, k, b.unit0 + lu);
      partial[2 * i] = lanes[0].mean;
      partial[2 * i + 1] = lanes[0].m2;
      ++partial_writes[i];
      // The covered count must be what finalize assumes.
      const int64_t pc = (b.unit0 + lu) % p.PC;
      if (lanes[0].n != static_cast<A>(nhwc_tile_rows(p, k) * nhwc_unit_width(p, pc))) return 7;
    }
  }
  for (int w : partial_writes) {
    if (w != 1) return 8;
  }
  // finalize (double)
  std::vector<A> stats(2 * N * G);
  std::vector<double> means(N * G), rstds(N * G);
  for (int64_t ng = 0; ng < N * G; ++ng) {
    const int64_t n = ng / G, g = ng % G;
    Moments<double> m{0, 0, 0};
    for (int64_t j = 0; j < p.K * p.PC; ++j) {
      const int64_t k = j / p.PC, pc = j % p.PC;
      const int64_t i = nhwc_partial_index(p, n, k, g * p.PC + pc);
      merge(m, static_cast<double>(nhwc_tile_rows(p, k) * nhwc_unit_width(p, pc)), static_cast<double>(partial[2 * i]),
            static_cast<double>(partial[2 * i + 1]));
    }
    const double var = m.m2 > 0 ? m.m2 / static_cast<double>(S * p.Cg) : 0.0;
    stats[2 * ng] = static_cast<A>(m.mean);
    stats[2 * ng + 1] = static_cast<A>(1.0 / std::sqrt(var + eps));
    means[ng] = stats[2 * ng];
    rstds[ng] = stats[2 * ng + 1];
  }
  // apply, with the kernel's grid-stride loops over `grid` blocks
  std::vector<double> y(numel, std::nan(""));
  std::vector<int> writes(numel, 0);
  const NhwcThreads at = nhwc_apply_threads(C, VEC, kThreads);
  const int64_t rows = N * S, CV = C / VEC;
  for (int64_t blk = 0; blk < grid; ++blk) {
    for (int tid = 0; tid < at.cols * at.rpp; ++tid) {
      const int cv0 = tid % at.cols, ry = tid / at.cols;
      for (int64_t r = blk * at.rpp + ry; r < rows; r += grid * at.rpp) {
        const int64_t n = r / S;
        for (int64_t cv = cv0; cv < CV; cv += at.cols) {
          for (int i = 0; i < VEC; ++i) {
            const int64_t c = cv * VEC + i, g = (cv * VEC) / p.Cg;  // the vector's group
            const A mean = stats[2 * (n * G + g)], rstd = stats[2 * (n * G + g) + 1];
            A v = (x[r * C + c] - mean) * (rstd * static_cast<A>(wd[c])) + static_cast<A>(bd[c]);
            if (act == 1) v = v / (A(1) + std::exp(-v));
            y[r * C + c] = v;
            ++writes[r * C + c];
          }
        }
      }
    }
  }
  for (int w : writes) {
    if (w != 1) return 9;
  }
  std::fwrite(y.data(), 8, numel, out);
  std::fwrite(means.data(), 8, N * G, out);
  std::fwrite(rstds.data(), 8, N * G, out);
  std::free(x);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: gn_nhwc_host float|double VEC GRID IN OUT\n");
    return 1;
  }
  FILE* in = std::fopen(argv[4], "rb");
  FILE* out = std::fopen(argv[5], "wb");
  if (in == nullptr || out == nullptr) return 1;
  const bool dbl = std::strcmp(argv[1], "double") == 0;
  const int vec = std::atoi(argv[2]);
  const int64_t grid = std::atoll(argv[3]);
  int rc = 4;
  if (dbl && vec == 1) rc = run<double, 1>(in, out, grid);
  if (dbl && vec == 2) rc = run<double, 2>(in, out, grid);
  if (!dbl && vec == 1) rc = run<float, 1>(in, out, grid);
  if (!dbl && vec == 4) rc = run<float, 4>(in, out, grid);
  if (!dbl && vec == 8) rc = run<float, 8>(in, out, grid);  // the 16-bit types' width
  std::fclose(in);
  std::fclose(out);
  return rc;
}
