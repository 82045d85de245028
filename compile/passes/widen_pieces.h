// Reduced gradients widened piece by piece. Invariant afterwards: no widening cast (bf16 / f16 to f32) reads a
// dim-0 concatenation that nothing else reads and whose result a data-parallel reduction start (all-reduce or
// reduce-scatter) reads; each such cast became one cast per piece, read by the concatenation (now in f32), and a
// piece that is a reshape of a value nothing else reads is cast before the reshape, so the cast reads the value's
// producer itself: a product then becomes one widened product (matmul_epilogue.h), a reduction or pointwise op
// takes the cast into its kernel (fuse.h), and bucket_views.h places every piece in the reduction's input.
// Test: tests/compile/passes/test_widen_pieces.cpp.
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct WidenPiecesOptions {
  Device target = Device::cpu();
};

bool widen_pieces(Graph& g, const WidenPiecesOptions& o);

}  // namespace ingot::compiler::passes
