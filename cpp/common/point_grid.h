// The k nearest points of a query by a uniform grid of cells over one cloud (knn, three_nn): cells
// are searched in growing shells around the query's cell until no unvisited cell can hold a point
// as near as the k-th found. Exact: distances are point_cloud::squared_distance of the same float
// coordinates as the full scan's, candidates rank by (distance, index) whatever order the cells are
// visited in, and a shell stops the search only when every unvisited point's distance, rounding
// included, is strictly above the k-th. The caller scans instead where build() or search() says
// the grid does not apply (a non-finite coordinate in the cloud or the query, too few points, a
// cloud of one location).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "opbridge/point_cloud.h"

OPBRIDGE_NO_FP_CONTRACT_BEGIN
namespace opbridge::point_cloud {

// The sorted k best (distance, index) of one query: insert(v, i) keeps the k smallest by distance,
// then index, so a candidate met out of index order still ranks as the index-ordered scan ranks it.
template <class C>
struct NearestK {
  int64_t k = 0, filled = 0;
  C* d = nullptr;
  int64_t* i = nullptr;

  void reset() { filled = 0; }
  bool full() const { return filled == k; }
  // Whether (v, idx) ranks before the k-th best (or a slot is free).
  bool enters(C v, int64_t idx) const {
    return filled < k || v < d[k - 1] || (v == d[k - 1] && idx < i[k - 1]);
  }
  void insert(C v, int64_t idx) {
    int64_t at = filled < k ? filled++ : k - 1;
    while (at > 0 && (v < d[at - 1] || (v == d[at - 1] && idx < i[at - 1]))) {
      d[at] = d[at - 1];
      i[at] = i[at - 1];
      --at;
    }
    d[at] = v;
    i[at] = idx;
  }
};

template <class C>
class CellGrid {
 public:
  // Points per cell the grid aims at: fewer cells to visit against fewer points per cell (k / 2
  // measured best for k = 16, 2 for k = 3; the k-th neighbour then lies mostly within one shell).
  static constexpr double kMinPointsPerCell = 2.0;
  // Below this many points (or k above n / kMinPointsPerK) the full scan is as fast.
  static constexpr int64_t kMinPoints = 128;
  static constexpr int64_t kMinPointsPerK = 8;

  // x: one cloud's structure-of-arrays rows (x, y, z at strides of n). False where the grid does
  // not apply; the caller then scans.
  bool build(const C* x, int64_t n, int64_t k) {
    n_ = n;
    if (n < kMinPoints || k * kMinPointsPerK > n) return false;
    double lo[3], hi[3];
    for (int d = 0; d < 3; ++d) {
      const C* r = x + d * n;
      double a = r[0], b = r[0];
      for (int64_t j = 0; j < n; ++j) {
        const double v = r[j];
        if (!std::isfinite(v)) return false;
        a = std::min(a, v), b = std::max(b, v);
      }
      lo[d] = a, hi[d] = b;
    }
    // Cell edge h from the extents, dropping dimensions thinner than a cell (flat or linear clouds).
    double e[3] = {hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]};
    double s[3] = {e[0], e[1], e[2]};
    std::sort(s, s + 3, [](double a, double b) { return a > b; });
    if (!(s[0] > 0) || !std::isfinite(s[0])) return false;
    const double points_per_cell = std::max(kMinPointsPerCell, 0.5 * static_cast<double>(k));
    double h = 0;
    for (int nd = 3; nd >= 1; --nd) {
      double vol = 1;
      for (int d = 0; d < nd; ++d) vol *= s[d];
      h = std::pow(vol * points_per_cell / static_cast<double>(n), 1.0 / nd);
      if (nd == 1 || s[nd - 1] >= h) break;
    }
    if (!(h > 0) || !std::isfinite(h)) return false;
    inv_h_ = 1.0 / h;
    if (!std::isfinite(inv_h_)) return false;
    int64_t cells = 1;
    for (int d = 0; d < 3; ++d) {
      const double g = std::ceil(e[d] * inv_h_);
      g_[d] = static_cast<int64_t>(std::clamp(g, 1.0, 65536.0));
      lo_[d] = lo[d];
      top_[d] = (hi[d] - lo[d]) * inv_h_;
      cells *= g_[d];
    }
    if (cells > 4 * n + 64) return false;
    // Counting sort of the points by cell (x fastest, so a row of cells is one contiguous range).
    std::vector<int64_t> cell(static_cast<size_t>(n));
    start_.assign(static_cast<size_t>(cells + 1), 0);
    for (int64_t j = 0; j < n; ++j) {
      int64_t c[3];
      for (int d = 0; d < 3; ++d) c[d] = cell_of(static_cast<double>(x[d * n + j]), d);
      cell[j] = (c[2] * g_[1] + c[1]) * g_[0] + c[0];
      ++start_[cell[j] + 1];
    }
    for (int64_t c = 0; c < cells; ++c) start_[c + 1] += start_[c];
    std::vector<int64_t> fill(start_.begin(), start_.end() - 1);
    soa_.resize(static_cast<size_t>(3 * n));
    index_.resize(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {  // ascending j: each cell's points stay in index order
      const int64_t at = fill[cell[j]]++;
      soa_[at] = x[j], soa_[n + at] = x[n + j], soa_[2 * n + at] = x[2 * n + j];
      index_[at] = j;
    }
    return true;
  }

  // The k nearest points to (cx, cy, cz) into best (sorted by distance, then index). False for a
  // non-finite query (the caller scans). scratch: kBlock distances.
  bool search(C cx, C cy, C cz, NearestK<C>& best, C* scratch) const {
    const C q[3] = {cx, cy, cz};
    double u[3], outside[3];
    int64_t cc[3];
    for (int d = 0; d < 3; ++d) {
      if (!std::isfinite(static_cast<double>(q[d]))) return false;
      u[d] = (static_cast<double>(q[d]) - lo_[d]) * inv_h_;
      cc[d] = static_cast<int64_t>(std::clamp(std::floor(u[d]), 0.0, static_cast<double>(g_[d] - 1)));
      // How far outside the cloud's extent the query lies, in cells (points' u are in [0, top_]).
      outside[d] = std::max({0.0, -u[d], u[d] - top_[d]});
    }
    best.reset();
    for (int64_t r = 0;; ++r) {
      const int64_t z0 = std::max<int64_t>(0, cc[2] - r), z1 = std::min(g_[2] - 1, cc[2] + r);
      const int64_t y0 = std::max<int64_t>(0, cc[1] - r), y1 = std::min(g_[1] - 1, cc[1] + r);
      const int64_t x0 = std::max<int64_t>(0, cc[0] - r), x1 = std::min(g_[0] - 1, cc[0] + r);
      for (int64_t z = z0; z <= z1; ++z) {
        for (int64_t y = y0; y <= y1; ++y) {
          const int64_t row = (z * g_[1] + y) * g_[0];
          if (z == cc[2] - r || z == cc[2] + r || y == cc[1] - r || y == cc[1] + r) {
            visit(start_[row + x0], start_[row + x1 + 1], q, best, scratch);
          } else {  // inside the shell's z and y range: only its two x ends are new
            if (cc[0] - r >= 0) visit(start_[row + cc[0] - r], start_[row + cc[0] - r + 1], q, best, scratch);
            if (cc[0] + r < g_[0]) visit(start_[row + cc[0] + r], start_[row + cc[0] + r + 1], q, best, scratch);
          }
        }
      }
      // The nearest an unvisited point can be: its cell is r + 1 or more cells from the query's in
      // some dimension d, on a side where cells remain, and in every other dimension it is at
      // least as far as the cloud's extent is from the query (a query outside the cloud).
      double bound = std::numeric_limits<double>::infinity();
      for (int d = 0; d < 3; ++d) {
        double gap = std::numeric_limits<double>::infinity();
        if (cc[d] - r - 1 >= 0) gap = std::min(gap, u[d] - static_cast<double>(cc[d] - r));
        if (cc[d] + r + 1 < g_[d]) gap = std::min(gap, static_cast<double>(cc[d] + r + 1) - u[d]);
        if (gap == std::numeric_limits<double>::infinity()) continue;
        double sum = 0;
        for (int e = 0; e < 3; ++e) {
          const double w = world(e == d ? std::max(gap, outside[e]) : outside[e]);
          sum += w * w;
        }
        bound = std::min(bound, sum);
      }
      if (bound == std::numeric_limits<double>::infinity()) return true;  // every cell visited
      if (!best.full()) continue;
      // Margins for the float distance's rounding (a few ulps relative, plus underflow's absolute
      // error), so that a stop is never a tie or a rounding away from being wrong.
      if (static_cast<double>(best.d[best.k - 1]) < bound * (1 - kRelMargin) - kAbsMargin) return true;
    }
  }

  int64_t size() const { return n_; }

 private:
  static constexpr double kRelMargin = std::is_same_v<C, double> ? 1e-10 : 1e-4;
  static constexpr double kAbsMargin = std::is_same_v<C, double> ? 1e-300 : 1e-36;

  // A separation of c cells in world units, less the cell coordinates' rounding (double).
  double world(double c) const { return std::max(0.0, c * (1 - 1e-12) - 1e-9) / inv_h_; }

  int64_t cell_of(double v, int d) const {
    const double u = (v - lo_[d]) * inv_h_;
    return static_cast<int64_t>(std::clamp(std::floor(u), 0.0, static_cast<double>(g_[d] - 1)));
  }

  void visit(int64_t a, int64_t b, const C* q, NearestK<C>& best, C* d) const {
    const C inf = std::numeric_limits<C>::infinity();
    // The k-th distance while the list is full (+inf before: every point enters); a tie with it
    // goes on to the index comparison.
    C worst = best.full() ? best.d[best.k - 1] : inf;
    for (int64_t i0 = a; i0 < b; i0 += kBlock) {
      const int64_t len = std::min(kBlock, b - i0);
      block_distances(soa_.data(), n_, i0, len, q[0], q[1], q[2], d);
      for (int64_t j = 0; j < len; ++j) {
        C v = d[j];
        if (v > worst) continue;
        if (std::isnan(v)) v = inf;
        const int64_t idx = index_[i0 + j];
        if (best.enters(v, idx)) {
          best.insert(v, idx);
          if (best.full()) worst = best.d[best.k - 1];
        }
      }
    }
  }

  int64_t n_ = 0;
  int64_t g_[3] = {1, 1, 1};
  double lo_[3] = {0, 0, 0};
  double top_[3] = {0, 0, 0};
  double inv_h_ = 1;
  std::vector<int64_t> start_;
  std::vector<C> soa_;
  std::vector<int64_t> index_;
};

// The B clouds of a call: their structure-of-arrays copy (what the scan reads) and a grid over
// each, built in parallel.
template <class C>
class CloudGrids {
 public:
  template <class T>
  CloudGrids(const T* clouds, int64_t B, int64_t n, int64_t k, const ParallelFor& pf)
      : n_(n), soa_(structure_of_arrays<C>(clouds, B, n, pf)), grids_(static_cast<size_t>(B)),
        gridded_(static_cast<size_t>(B)) {
    pf(B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) gridded_[b] = grids_[b].build(cloud(b), n, k);
    });
  }
  // Cloud b's rows (x, y, z at strides of n).
  const C* cloud(int64_t b) const { return soa_.data() + 3 * b * n_; }
  // CellGrid::search on cloud b; false where its grid does not apply (the caller scans).
  bool search(int64_t b, C cx, C cy, C cz, NearestK<C>& best, C* scratch) const {
    return gridded_[b] && grids_[b].search(cx, cy, cz, best, scratch);
  }

 private:
  int64_t n_;
  std::vector<C> soa_;
  std::vector<CellGrid<C>> grids_;
  std::vector<char> gridded_;
};

}  // namespace opbridge::point_cloud
OPBRIDGE_NO_FP_CONTRACT_END
