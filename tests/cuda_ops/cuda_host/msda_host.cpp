// Host emulation of the MultiScaleDeformableAttention CUDA kernels' per-thread math
// (ops/ms_deform_attn/ms_deform_attn_math.cuh), for tests/cuda_ops/test_cuda_host.py on machines
// without a GPU. Runs the same functions the kernels run, over every thread (forward) and every
// lane (backward) of the kernels' decomposition; the lanes' shares are summed as the warp
// shuffles do and atomics become plain additions.
//
//   msda_host TYPE VEC IN OUT      TYPE: float | double; VEC: vector width in elements
// IN:  int64 N S M D Lq L P, int64 spatial_shapes[L][2], int64 level_start_index[L], then float64
//      value, sampling_locations, attention_weights, grad_output (the op's shapes)
// OUT: float64 output, grad_value, grad_sampling_locations, grad_attention_weights
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace opbridge::cuda {
inline float to_acc(float v) { return v; }
inline double to_acc(double v) { return v; }
namespace msda {
template <int VEC, class GV, class A>
void atomic_add_vec(GV* p, const A* v) {
  for (int k = 0; k < VEC; ++k) p[k] += static_cast<GV>(v[k]);
}
}  // namespace msda
}  // namespace opbridge::cuda

#include "ops/ms_deform_attn/ms_deform_attn_math.cuh"

namespace msda = opbridge::cuda::msda;

namespace {

// 64-byte aligned storage of exactly `count` elements (the kernels' vector loads need VEC *
// sizeof(T) alignment; no slack, so that AddressSanitizer sees any access past the end).
template <class T>
struct Buffer {
  T* p = nullptr;
  size_t n = 0;
  explicit Buffer(size_t count) : n(count) {
    void* mem = nullptr;
    if (posix_memalign(&mem, 64, count > 0 ? count * sizeof(T) : 1) != 0) std::abort();
    p = static_cast<T*>(mem);
    std::memset(p, 0, count * sizeof(T));
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

template <class T>
void read_into(FILE* f, Buffer<T>& b) {
  std::vector<double> tmp(b.n);
  if (b.n && std::fread(tmp.data(), sizeof(double), b.n, f) != b.n) {
    std::fprintf(stderr, "short input\n");
    std::exit(2);
  }
  for (size_t i = 0; i < b.n; ++i) b.p[i] = static_cast<T>(tmp[i]);
}

template <class T>
void write_from(FILE* f, const Buffer<T>& b) {
  std::vector<double> tmp(b.p, b.p + b.n);
  if (b.n) std::fwrite(tmp.data(), sizeof(double), b.n, f);
}

int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

template <class T, int VEC>
int run(FILE* in, FILE* out) {
  using A = T;   // float accumulates in float, double in double, as on the device
  using GV = T;  // grad_value accumulation type (float for the 16-bit types too)
  int64_t h[7];
  if (std::fread(h, sizeof(int64_t), 7, in) != 7) return 2;
  const int64_t N = h[0], S = h[1], M = h[2], D = h[3], Lq = h[4], L = h[5], P = h[6];
  if (L > msda::kMaxLevels || D % VEC != 0) return 3;
  std::vector<int64_t> shapes(2 * L), starts(L);
  if (std::fread(shapes.data(), sizeof(int64_t), 2 * L, in) != static_cast<size_t>(2 * L)) return 2;
  if (std::fread(starts.data(), sizeof(int64_t), L, in) != static_cast<size_t>(L)) return 2;
  msda::Levels lv{};
  for (int64_t l = 0; l < L; ++l) {
    lv.h[l] = static_cast<int32_t>(shapes[2 * l]);
    lv.w[l] = static_cast<int32_t>(shapes[2 * l + 1]);
    lv.start[l] = starts[l];
  }
  const int64_t queries = N * Lq * M;
  Buffer<T> value(N * S * M * D), loc(queries * L * P * 2), attn(queries * L * P), go(queries * D);
  read_into(in, value);
  read_into(in, loc);
  read_into(in, attn);
  read_into(in, go);
  Buffer<T> output(queries * D), gloc(queries * L * P * 2), gattn(queries * L * P);
  Buffer<GV> gvalue(N * S * M * D);
  const msda::Shape z{N, S, M, D, Lq, L, P, D / VEC};

  // Forward: every thread of the grid-stride loop.
  for (int64_t idx = 0; idx < queries * z.DV; ++idx) {
    A o[VEC];
    msda::forward_vector<VEC, T, A>(value.p, loc.p, attn.p, lv, z, idx, o);
    for (int k = 0; k < VEC; ++k) output.p[idx * VEC + k] = o[k];
  }

  // Backward: G lanes per query, as the kernel runs them.
  const int G = next_pow2(std::max<int64_t>(1, std::min<int64_t>(z.DV, 32)));
  const int64_t row = M * D, LP = L * P;
  for (int64_t r = 0; r < queries; ++r) {
    const int64_t vb = msda::value_base(z, r);
    for (int l = 0; l < L; ++l) {
      for (int64_t p = 0; p < P; ++p) {
        const int64_t j = l * P + p;
        A sv = 0, sx = 0, sy = 0, a = 0;
        msda::Sample<A> s;
        const bool valid = msda::setup_sample<A>(loc.p[r * LP * 2 + 2 * j], loc.p[r * LP * 2 + 2 * j + 1], lv.h[l],
                                                 lv.w[l], lv.start[l], row, &s);
        if (valid) {
          a = attn.p[r * LP + j];
          for (int lane = 0; lane < G; ++lane) {
            A lv_ = 0, lx = 0, ly = 0;
            msda::backward_sample<VEC, T, A, GV>(value.p + vb, go.p + r * D, gvalue.p + vb, z.DV, lane, G, a, s, &lv_,
                                                 &lx, &ly);
            sv += lv_;
            sx += lx;
            sy += ly;
          }
        }
        A g_attn, g_x, g_y;
        msda::sample_grads<A>(valid, a, lv.h[l], lv.w[l], sv, sx, sy, &g_attn, &g_x, &g_y);
        gattn.p[r * LP + j] = g_attn;
        gloc.p[2 * (r * LP + j)] = g_x;
        gloc.p[2 * (r * LP + j) + 1] = g_y;
      }
    }
  }
  write_from(out, output);
  write_from(out, gvalue);
  write_from(out, gloc);
  write_from(out, gattn);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: msda_host float|double VEC IN OUT\n");
    return 1;
  }
  FILE* in = std::fopen(argv[3], "rb");
  FILE* out = std::fopen(argv[4], "wb");
  if (in == nullptr || out == nullptr) return 1;
  const bool dbl = std::strcmp(argv[1], "double") == 0;
  const int vec = std::atoi(argv[2]);
  int rc = 4;
  if (dbl && vec == 1) rc = run<double, 1>(in, out);
  if (dbl && vec == 2) rc = run<double, 2>(in, out);
  if (!dbl && vec == 1) rc = run<float, 1>(in, out);
  if (!dbl && vec == 2) rc = run<float, 2>(in, out);
  if (!dbl && vec == 4) rc = run<float, 4>(in, out);
  if (!dbl && vec == 8) rc = run<float, 8>(in, out);  // the 16-bit types' width, over float data
  std::fclose(in);
  std::fclose(out);
  return rc;
}
