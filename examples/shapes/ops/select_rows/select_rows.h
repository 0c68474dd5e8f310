// shapes::select_rows: the rows of x whose largest element exceeds threshold, in order: an output whose
// size the input values decide (rule "?, x[1]").
//
// The op's kernels, framework-free: raw pointers, sizes, the caller's thread pool, a Status.
// The torch op (select_rows_torch.cpp) and the ORT op (select_rows_ort.cpp) are thin adapters around them;
// the contract both follow (arguments, types, checks, output shapes) is the declaration in
// select_rows_decl.cpp.
#pragma once

#include <cstdint>

#include <opbridge/op_decl.h>
#include <opbridge/parallel.h>
#include <opbridge/status.h>

namespace shapes {

// The op's declaration (opbridge/op_decl.h); no gradient.
const opbridge::OpDecl& select_rows_decl();

// The kernel in two steps, as the output's size is known only after the first: count the rows to
// keep (and mark them in keep[rows]), then copy them to y [count, channels]. T: float or double.
template <class T>
int64_t select_rows_count(const T* x, int64_t rows, int64_t channels, double threshold, uint8_t* keep);
template <class T>
void select_rows_copy(const T* x, const uint8_t* keep, int64_t rows, int64_t channels, T* y);

}  // namespace shapes
