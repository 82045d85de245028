// Folding the GELU and its backward into the matrix products next to them. Invariant afterwards, for values on
// a CUDA target (or on any device with cpu_too): no gelu_tanh_grad node reads, directly or through one reshape,
// the output of a 2-D matmul that nothing else reads; each such pair became one matmul_dgelu node, which with
// with_dbias also took over a sum(reshape(grad, [M, N]), dims=[0]) of the GELU gradient (the bias gradient).
// With forward_gelu, no gelu_tanh reads (directly or through one reshape) a linear with a bias: each such pair is
// one linear_gelu node. And no cast to f32 reads a bf16 / f16 matmul that nothing else reads: the pair is one
// widened matmul (so is an eager column sum's, fuse.h's eager_column_sum).
// Test: tests/compile/passes/test_matmul_epilogue.cpp.
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct MatmulEpilogueOptions {
  Device target = Device::cpu();
  bool cpu_too = false;  // rewrite CPU values too (their fused ops have CPU evaluations; the tests use them)
  bool with_dbias = false;
  bool forward_gelu = true;
};

bool fuse_matmul_epilogues(Graph& g, const MatmulEpilogueOptions& o);

}  // namespace ingot::compiler::passes
