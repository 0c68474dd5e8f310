// eigen_reference: float64 reference results for the consumer tests, computed with Eigen and
// nothing of opbridge, so that the C++ programs' outputs are checked against an independent
// implementation (test-only: built when the tests configure with -DOPBRIDGE_SOURCE_DIR=<repo>).
//
//   eigen_reference inverse <x.npy> <y.npy>
//       x: (*, n, n) float64; y[b] = x[b]^-1 by Eigen's LU with partial pivoting
//   eigen_reference group_norm <x.npy> <weight.npy> <bias.npy> <num_groups> <eps> <y.npy>
//       x: (N, C, *spatial) float64, weight/bias: (C,) float64 or empty arrays (no affine)
#include <Eigen/Dense>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "npy.h"

namespace {

using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ArrayRM = Eigen::Array<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

const double* f64(const npy::Array& a, const char* name) {
  if (a.descr != "<f8") throw std::runtime_error(std::string(name) + ": expected float64, got " + a.descr);
  return reinterpret_cast<const double*>(a.data.data());
}

void inverse(const npy::Array& x, const std::string& out) {
  const size_t rank = x.shape.size();
  if (rank < 2 || x.shape[rank - 1] != x.shape[rank - 2]) throw std::runtime_error("x must be (*, n, n)");
  const int64_t n = x.shape[rank - 1];
  const int64_t batch = n == 0 ? 0 : x.numel() / (n * n);
  std::vector<double> y(static_cast<size_t>(x.numel()));
  for (int64_t b = 0; b < batch; ++b) {
    Eigen::Map<const RowMajor> a(f64(x, "x") + b * n * n, n, n);
    Eigen::Map<RowMajor>(y.data() + b * n * n, n, n) = Eigen::PartialPivLU<RowMajor>(a).inverse();
  }
  npy::write(out, "<f8", x.shape, y.data(), y.size() * sizeof(double));
}

void group_norm(const npy::Array& x, const npy::Array& w, const npy::Array& b, int64_t G, double eps,
                const std::string& out) {
  if (x.shape.size() < 2) throw std::runtime_error("x must be (N, C, *spatial)");
  const int64_t N = x.shape[0], C = x.shape[1];
  if (G <= 0 || C % G != 0) throw std::runtime_error("num_groups must divide C");
  const int64_t S = N * C == 0 ? 0 : x.numel() / (N * C);
  // One row per (sample, group): its statistics are row-wise means.
  Eigen::Map<const ArrayRM> groups(f64(x, "x"), N * G, (C / G) * S);
  const Eigen::ArrayXd mean = groups.rowwise().mean();
  const ArrayRM centered = groups.colwise() - mean;
  const Eigen::ArrayXd rstd = (centered.square().rowwise().mean() + eps).rsqrt();
  ArrayRM y = centered.colwise() * rstd;
  // One row per (sample, channel) for the per-channel affine.
  Eigen::Map<ArrayRM> channels(y.data(), N * C, S);
  const bool affine = w.numel() > 0;
  if (affine && (w.numel() != C || b.numel() != C)) throw std::runtime_error("weight and bias must be (C,)");
  for (int64_t r = 0; affine && r < N * C; ++r) {
    channels.row(r) = channels.row(r) * f64(w, "weight")[r % C] + f64(b, "bias")[r % C];
  }
  npy::write(out, "<f8", x.shape, y.data(), static_cast<size_t>(y.size()) * sizeof(double));
}

int usage() {
  std::fprintf(stderr,
               "usage: eigen_reference inverse <x.npy> <y.npy>\n"
               "       eigen_reference group_norm <x.npy> <weight.npy> <bias.npy> <num_groups> <eps> <y.npy>\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string op = argc > 1 ? argv[1] : "";
    if (op == "inverse" && argc == 4) {
      inverse(npy::read(argv[2]), argv[3]);
    } else if (op == "group_norm" && argc == 8) {
      group_norm(npy::read(argv[2]), npy::read(argv[3]), npy::read(argv[4]), std::atoll(argv[5]), std::atof(argv[6]),
                 argv[7]);
    } else {
      return usage();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
