// A narrow wire's gradient pieces read by the optimizer update itself. Invariant afterwards: no multi-tensor update
// that can take pieces (MultiTensorUpdate::with_gradient_pieces) reads a sum_pieces result (autograd/ops/
// sum_pieces.h) as its gradients: it reads the pieces, and the sum is gone unless something else reads it (then it is
// a pointwise op of its own that fuses into those readers' kernels). Test:
// tests/compile/passes/test_passes.cpp (PiecesIntoUpdate.*).
//
// Note [Pieces read by the update]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Compiled ZeRO-3 with a narrow wire (Note [Narrow wire, wide sum], distributed/process_group.h) sends each unit's
// gradient in bf16 and sums the world's pieces of this rank's chunk in f32. Summed by a kernel of its own, the
// pieces are read once (4 x 109 MB per 8B block at 4 ranks), the f32 sum written (218 MB) and read again by AdamW:
// ~21 GB of HBM traffic per step beside the compute, and the 8B step ran 10 ms slower than the same step without
// the sum (390 vs 400 ms on 4x H200, bench/RESULTS.md 2026-11-27, twenty-third session). So the exchange is the
// collective (exchange_unit_start) and the sum a graph op after its wait, and this pass hands the pieces to the
// update that reads the sum: AdamW adds them in f32 in the same order, scales them the same way, and goes on with
// the same arithmetic, so the update's bits do not change; the f32 gradient is never written.
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct PiecesIntoUpdateOptions {
  Device target = Device::cpu();
};

bool pieces_into_update(Graph& g, const PiecesIntoUpdateOptions& o);

}  // namespace ingot::compiler::passes
