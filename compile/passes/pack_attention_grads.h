// Attention gradients written where the fused qkv projection's backward wants them. Invariant afterwards: no cat
// reads the three outputs of one attention_bwd node, each through permute([0, 2, 1, 3]) and a reshape to
// [B, T, H * D] read nowhere else, in the order dq, dk, dv; each such group is one attention_bwd_packed node whose
// output is the cat's value (autograd/ops/attention_packed.h).
// Test: tests/compile/passes/test_pack_attention_grads.cpp.
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct PackAttentionGradsOptions {
  Device target = Device::cpu();
};

bool pack_attention_grads(Graph& g, const PackAttentionGradsOptions& o);

}  // namespace ingot::compiler::passes
