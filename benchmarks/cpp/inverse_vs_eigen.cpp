// Large-n Inverse: opbridge's CPU kernel (inverse_cpu, the runtime-dispatched AVX-512 / AVX2 /
// baseline Gauss-Jordan) against Eigen's blocked PartialPivLU (lu.inverse()), one thread, side by
// side in one process: rounds alternate between the two, and the medians are compared.
//
// Build against an installed opbridge (its include/ and lib/libopbridge_kernels.a) and Eigen
// (cmeel-eigen or Debian's libeigen3-dev), once with Eigen's baseline code and once with AVX-512
// code, as a runtime-dispatched copy would have:
//   P=$(python -m opbridge --cmake-dir)/../../..; E=$(python -m cmeel cmake)/include/eigen3   # or /usr/include/eigen3
//   g++ -O3 -DNDEBUG -std=c++17 -I$P/include -I$E benchmarks/cpp/inverse_vs_eigen.cpp $P/lib/libopbridge_kernels.a -o /tmp/inv_base
//   g++ -O3 -DNDEBUG -std=c++17 -mavx512f -mavx512vl -mavx512dq -mavx2 -mfma -I$P/include -I$E \
//       benchmarks/cpp/inverse_vs_eigen.cpp $P/lib/libopbridge_kernels.a -o /tmp/inv_avx512
//   /tmp/inv_base; /tmp/inv_avx512 [n ...]        (default n: 128 256 512)
// Prints, per dtype and n: both medians (µs per matrix) and opbridge's speed-up (> 1: faster),
// plus the largest |A·X - I| of each, so that a fast wrong answer cannot pass unnoticed.
#include <Eigen/Dense>
#include <opbridge/inverse.h>

#include <algorithm>
#include <ctime>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <vector>

namespace {

// Thread CPU time, not wall time: on a shared machine a preempted round would otherwise count the
// other processes' time (both kernels run on the calling thread only).
double now_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
double residual(const std::vector<T>& a, const std::vector<T>& x, int n) {
  Eigen::Map<const Mat<T>> A(a.data(), n, n), X(x.data(), n, n);
  const Mat<double> r = A.template cast<double>() * X.template cast<double>() - Mat<double>::Identity(n, n);
  return r.cwiseAbs().maxCoeff();
}

template <class T>
void bench(int n, int rounds, std::mt19937_64& gen) {
  std::normal_distribution<double> dist;
  std::vector<T> a(static_cast<size_t>(n) * n), ours(a.size()), eig(a.size());
  for (auto& v : a) v = static_cast<T>(dist(gen));
  // The matrix count per timed call keeps each call >= ~1 ms, above timer noise.
  const int reps = std::max(1, 4000000 / (n * n * n / 8 + 1));
  std::vector<double> t_ours, t_eig;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = now_us();
    for (int i = 0; i < reps; ++i) {
      const auto st = opbridge::inverse_cpu<T>(a.data(), ours.data(), 1, n, opbridge::ParallelFor());
      if (!st.ok()) std::printf("opbridge: %s\n", st.message().c_str());
    }
    const double t1 = now_us();
    for (int i = 0; i < reps; ++i) {
      Eigen::Map<const Mat<T>> A(a.data(), n, n);
      Eigen::Map<Mat<T>> X(eig.data(), n, n);
      X = Eigen::PartialPivLU<Mat<T>>(A).inverse();
    }
    const double t2 = now_us();
    t_ours.push_back((t1 - t0) / reps);
    t_eig.push_back((t2 - t1) / reps);
  }
  std::sort(t_ours.begin(), t_ours.end());
  std::sort(t_eig.begin(), t_eig.end());
  const double mo = t_ours[t_ours.size() / 2], me = t_eig[t_eig.size() / 2];
  std::printf("%-7s n=%4d  opbridge %9.1f us  Eigen PartialPivLU %9.1f us  speed-up %.2fx  |AX-I| %.1e / %.1e\n",
              sizeof(T) == 4 ? "float32" : "float64", n, mo, me, me / mo, residual(a, ours, n), residual(a, eig, n));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {128, 256, 512};
  std::mt19937_64 gen(std::random_device{}());
  std::printf("Eigen %d.%d.%d, SIMD: %s, opbridge ISA: %s\n", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION,
              EIGEN_MINOR_VERSION, Eigen::SimdInstructionSetsInUse(), opbridge::cpu_isa_name(opbridge::cpu_isa_resolve(opbridge::CpuIsa::kAuto)));
  for (int n : sizes) {
    bench<float>(n, 15, gen);
    bench<double>(n, 15, gen);
  }
  return 0;
}
