// Reduced gradients cast piece by piece. Invariant afterwards: no cast between f32 and bf16 / f16 reads a dim-0
// concatenation that nothing else reads and whose cast result a data-parallel reduction start (all-reduce or
// reduce-scatter) reads; each such cast became one cast per piece, read by the concatenation (now in the cast's
// dtype). A piece that is a reshape of a value nothing else reads is cast before the reshape, so the cast reads
// the value's producer itself; a narrowing cast of a value widened from that very dtype (bf16 -> f32 -> bf16, exact)
// is no cast at all. Widening (bf16 gradients reduced in f32): a product then becomes one widened product
// (matmul_epilogue.h); narrowing (f32 gradients reduced in bf16, DDP's reduce_dtype): autocast's widening of a bf16
// product is dropped and the product writes the bf16 bucket itself. Reductions and pointwise ops take their casts
// into their kernels (fuse.h), and bucket_views.h places every piece in the reduction's input.
// Test: tests/compile/passes/test_cast_pieces.cpp.
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct CastPiecesOptions {
  Device target = Device::cpu();
};

bool cast_pieces(Graph& g, const CastPiecesOptions& o);

}  // namespace ingot::compiler::passes
