// The norm backward primitive for the compiler's graph rewrites (compile/passes/decompose_norm_bwd.cpp);
// models use layer_norm / rms_norm of autograd/ops.h, whose VJP builds it.
#pragma once

#include <memory>
#include <optional>

#include "autograd/primitive.h"

namespace ingot {

// inputs:  dy, x, mean (undefined for rms_norm), rstd, w (may be undefined)
// outputs: the wanted ones among dx (like x), dw, db ([C], f32; f64 for f64 x), in that order.
// Fusion kind: Reduction when it computes dx alone (over the last dim) or dw/db alone (over the leading dims),
// Opaque when it computes both (the eager fused kernel).
std::shared_ptr<Primitive> make_norm_bwd(bool centered, bool dx, bool dw, bool db);

struct NormBwdFlags {
  bool centered = false, dx = false, dw = false, db = false;
};
// The flags of a layer_norm_bwd / rms_norm_bwd primitive, or nullopt when `p` is not one.
std::optional<NormBwdFlags> norm_bwd_flags(const Primitive& p);

}  // namespace ingot
