// opbridge Inverse: Y[b] = X[b]^-1 for a batch of square matrices.
//
// Semantics of torch.linalg.inv (and com.microsoft::Inverse) on CPU: X is (*, n, n), Y has X's
// shape. A matrix is singular when elimination with partial (row) pivoting meets a pivot that
// is exactly zero, i.e. when U[k,k] == 0 in its LU factorization P X = L U, the test LAPACK's
// getrf (and so torch.linalg.inv) applies. The multipliers are true (correctly rounded)
// quotients, so a zero row or column, or a row equal to (or a power-of-two multiple of)
// another, is always found singular; a matrix singular only up to rounding gets a huge,
// inaccurate inverse, as with torch. NaN inputs give NaN outputs, not an error.
//
// Layout used by every kernel: a and out are contiguous [batch, n, n], row-major.
#pragma once

#include <cstdint>
#include <vector>

#include "opbridge/cpu_isa.h"
#include "opbridge/kernel.h"
#include "opbridge/op_decl.h"
#include "opbridge/parallel.h"
#include "opbridge/status.h"

namespace opbridge {

// The ONNX op type in domain ai.opbridge: the contract between exporter and ORT library.
inline constexpr const char* kInverseOpType = "Inverse";

// The op's declaration (opbridge/op_decl.h): arguments, types, versions, output rule, checks.
const OpDecl& inverse_decl();

// The [batch, n, n] view of x (*, n, n), shared by every adapter: an empty x has batch = 0 and
// n * n is never formed then (x = [0, 2^32, 2^32] cannot overflow). shape: already validated.
struct InverseDims {
  int64_t batch = 0, n = 0;
};
InverseDims inverse_dims(const std::vector<int64_t>& shape);

// The kernels' arguments besides the tensors, from a call that passed the declaration's checks
// (inverse_params, with the declaration in inverse_decl.cpp).
struct InverseParams {
  InverseDims d;
  bool nan_on_singular = false;  // on_singular == "nan"
};
InverseParams inverse_params(const KernelCall& k);

// Inverse on the CPU.
//   a:     [batch, n, n] input matrices, row-major
//   out:   [batch, n, n] their inverses; may be the same pointer as `a` (in place) but must
//          not overlap it otherwise
//   batch: number of matrices (>= 0)
//   n:     matrix size (>= 0)
//   pf:    the caller's parallel-for (matrices are distributed over it)
//   isa:   the instruction-set variant to run (kAuto: the process-wide level, see cpu_isa.h);
//          asking for one the CPU lacks returns a NotImplemented status. kAvx512 runs the AVX2
//          kernels below n = 128 and an AVX-512 one from there on
//   nan_on_singular: what a singular matrix does. false (ONNX attribute on_singular = "raise"):
//          the call fails with a RuntimeError naming the first singular matrix, e.g.
//          "matrix 3 of the batch is singular (U[2,2] == 0)", where 3 counts matrices in
//          row-major order of the batch dimensions; `out` is then unspecified. true
//          (on_singular = "nan"): that matrix's output is all NaN, every other matrix is
//          inverted as usual and the call succeeds -- what com.microsoft::Inverse gives in
//          effect, and what a batch of independent problems (one Kalman update per track) needs,
//          where one degenerate item must not fail the others.
// T is float or double. Arguments must already have passed the
// declaration's checks (check_call). The variants may
// differ in the last bits (AVX2 fuses multiply-adds).
template <class T>
Status inverse_cpu(const T* a, T* out, int64_t batch, int64_t n, const ParallelFor& pf,
                   CpuIsa isa = CpuIsa::kAuto, bool nan_on_singular = false);

}  // namespace opbridge
