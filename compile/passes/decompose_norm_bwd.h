// Splitting the norm backward. Invariant afterwards: no layer_norm_bwd / rms_norm_bwd node computes dx together
// with dw or db, except one that a CUDA target's kernel computes whole (column_sum_norm_bwd); each such node
// became a dx-only node (a reduction over the last dim) followed by a dw/db-only node (a reduction over the
// leading dims) with the same inputs and the original output values, and when dy came from a single-input
// pointwise node (the cast of an autocast matmul's gradient) the dw/db node reads its own copy of that node.
// Run after the last cse, which would merge the copy back.
// Test: tests/compile/passes/test_norm_bwd.cpp (DecomposeNormBwd.*).
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct DecomposeNormBwdOptions {
  Device target = Device::cpu();
};

bool decompose_norm_bwd(Graph& g, const DecomposeNormBwdOptions& o);

// Whether `n` is a norm backward on a CUDA value computing dx with dw and/or db that one CUDA kernel computes
// whole (Note [Column sums in row reductions]); fuse treats it as a reduction, decompose_norm_bwd keeps it.
bool column_sum_norm_bwd(const Graph& g, const Node& n);

}  // namespace ingot::compiler::passes
