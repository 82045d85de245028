// Cross-entropy fused with its backward. Invariant afterwards: no cross_entropy node has a cross_entropy_bwd
// reader (of its lse, with the same logits, target and attributes) whose dloss the cross_entropy node does not
// reach; each such pair became one cross_entropy_fused node that keeps the forward's loss and lse values and the
// backward's dlogits value, placed where the backward was, with the forward's other dependents after it.
// Test: tests/compile/passes/test_fuse_cross_entropy.cpp.
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct FuseCrossEntropyOptions {
  Device target = Device::cpu();
};

bool fuse_cross_entropy(Graph& g, const FuseCrossEntropyOptions& o);

}  // namespace ingot::compiler::passes
