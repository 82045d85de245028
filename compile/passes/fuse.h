// Fusion grouping. Invariant afterwards: every node is in at most one FusionGroup, and each group is one of
//   Pointwise     a DAG of Pointwise nodes whose outputs all have one shape (inputs may broadcast), or siblings
//                 reading one input of that shape (Note [Sibling fusion]);
//   RowReduction  one Reduction node (softmax, norms, cross-entropy, sums; on a CUDA target also a norm backward
//                 that computes its column sums, decompose_norm_bwd.h) with the pointwise nodes of its input's
//                 shape that feed it (prologue) and the pointwise nodes that consume it (epilogue);
//   MultiTensor   every multi-tensor optimizer update of the graph (horizontal fusion over all parameters), or,
//                 with horizontal = false, each update alone; or, on a CUDA target, every cast of an f32 graph
//                 input (a parameter) to bf16 / f16 that only non-fusible ops read (Note [Parameter casts]), or
//                 every cast of an update's f32 output to bf16 / f16 that is only written back (Note [Update copies]).
// Groups never create a cycle between groups, so they can be scheduled contiguously (schedule.h). Groups list
// their inputs (values read from outside) and outputs (values read outside or roots). View and Opaque nodes stay
// alone, and so does an eager_column_sum. Test: tests/compile/passes/test_passes.cpp (Fuse.*).
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct FuseOptions {
  Device target = Device::cpu();
  bool horizontal = true;  // all multi-tensor updates in one group (false: split updates keep their own)
};

bool fuse(Graph& g, const FuseOptions& o);

// Note [Column sums]: whether `n` is a row sum of a tall bf16 / f16 CUDA matrix with no pointwise producer, which
// fuse leaves to the eager reduce kernel (and fuse_matmul_epilogues may widen to f32).
bool eager_column_sum(const Graph& g, const Node& n);

}  // namespace ingot::compiler::passes
