// Attention's backward writing dq, dk, dv into one packed tensor, for the compiler's graph rewrites
// (compile/passes/pack_attention_grads.cpp); models never build it directly.
#pragma once

#include <memory>

#include "autograd/primitive.h"

namespace ingot {

// For an attention_bwd primitive (inputs dout, q, k, v, out, lse; outputs dq [B, Hq, T, D], dk and dv
// [B, Hkv, T, D]): the primitive with the same inputs and one output [B, T, (Hq + 2 Hkv) * D] holding, per
// token, dq's heads then dk's then dv's; that is cat([dq, dk, dv] each permuted to [B, T, H, D] and flattened
// to [B, T, H * D], dim=-1), which the CUDA kernels write in place. nullptr when `bwd` does not hold
// AttentionBwdAttrs (autograd/ops/attrs.h), which attention_bwd alone does.
std::shared_ptr<Primitive> packed_attention_bwd(const Primitive& bwd);

}  // namespace ingot
