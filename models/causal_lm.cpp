#include "models/causal_lm.h"

namespace ingot::models {

Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  INGOT_CHECK(logits.dim() == 3, "lm_loss: expected logits [B, T, V], got ", shape_str(logits.shape()));
  INGOT_CHECK(targets.shape() == Shape({logits.size(0), logits.size(1)}), "lm_loss: expected targets [",
              logits.size(0), ", ", logits.size(1), "], got ", shape_str(targets.shape()));
  // cross_entropy computes in f32 (f64 for f64 logits) and returns an f32 loss for 16-bit logits, so no
  // f32 copy of the logits is made here.
  return cross_entropy(reshape(logits, {-1, logits.size(2)}), reshape(targets, {-1}));
}

Tensor CausalLM::loss(const Tensor& ids, const Tensor& targets) { return lm_loss(forward(ids), targets); }

}  // namespace ingot::models
