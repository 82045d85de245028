// Cross-entropy fused with its backward, for the compiler's graph rewrite (compile/passes/fuse_cross_entropy.cpp);
// models never build it directly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "autograd/primitive.h"

namespace ingot {

// inputs:  logits [N, C], target [N] i64, dloss [N] (the loss dtype: the cotangent of each row's loss)
// outputs: loss [N] and lse [N] as cross_entropy's, dlogits [N, C] as cross_entropy_bwd's. One kernel,
//          cross_entropy_fused; dlogits may take the logits' buffer (Note [Outputs over dead inputs]). No vjp.
std::shared_ptr<Primitive> make_cross_entropy_fused(int64_t ignore_index, double label_smoothing);

// Typed attributes (Note [Typed attributes], autograd/primitive.h) of cross_entropy (backward = false) and
// cross_entropy_bwd (backward = true); cross_entropy_fused does not hold them.
struct CrossEntropyAttrs {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  bool backward = false;
};
// The attributes of a cross_entropy or cross_entropy_bwd primitive (match<CrossEntropyAttrs>), or nullopt when
// `p` is neither.
std::optional<CrossEntropyAttrs> cross_entropy_attrs(const Primitive& p);

}  // namespace ingot
