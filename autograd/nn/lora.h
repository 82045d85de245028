// LoRA (Hu et al. 2021, "Low-Rank Adaptation of Large Language Models"): a frozen projection W plus a trained
// low-rank update, y = x W^T + b + (alpha / r) * B(A(dropout(x))), A [r, in], B [out, r].
//
// Models build their projections as LoRALinear, which is an ordinary Linear until add_lora() is called, so a
// model needs no rebuilding to be adapted. Names follow PEFT: the adapter of "...self_attn.q_proj" is
// "...self_attn.q_proj.lora_A.weight" / "...lora_B.weight", so PEFT's adapter_model.safetensors keys are ours
// with "base_model.model." in front. A starts as PyTorch's Linear default (kaiming uniform) and B as zeros, as
// in PEFT, so an adapted model first computes exactly what the base model does.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/nn/layers.h"

namespace ingot::nn {

struct LoRAConfig {
  int64_t rank = 8;
  double alpha = 16.0;
  double dropout = 0.0;
  // Last components of module names to adapt ("q_proj", "v_proj", "c_attn"); every match is adapted.
  std::vector<std::string> target_modules{"q_proj", "v_proj"};
  double scale() const { return alpha / static_cast<double>(rank); }
};

// A frozen base weight kept in another form than the dense `weight` parameter (models/qlora.h: NF4). A
// LoRALinear given one computes its base output with it and holds no values in `weight`.
class FrozenBase {
 public:
  virtual ~FrozenBase() = default;
  virtual Tensor forward(const Tensor& x) const = 0;  // x W^T, differentiable in x
  virtual Tensor dense(DType dtype) const = 0;        // W [out, in], no gradient
};

// A projection's output as its two summands: the base product (bias included) and the adapter's scaled update in
// the base's dtype (undefined without an unmerged adapter). LoRALinear::forward returns base + delta; a caller that
// can add them in a wider type takes them apart (Note [Rope of a sum], autograd/ops/attention.cpp).
struct LoRAParts {
  Tensor base, delta;
  Tensor sum() const;
};

class LoRALinear : public Linear {
 public:
  using Linear::Linear;
  // Adds lora_A / lora_B / lora_dropout children on the weight's device and dtype (compute dtype inherited) and
  // freezes weight and bias. Adding twice is an error naming `name`.
  void add_lora(const LoRAConfig& cfg, const std::string& name = "LoRALinear");
  bool has_lora() const { return lora_a_ != nullptr; }
  double lora_scale() const { return scale_; }
  // Base output plus the adapter's; the adapter is skipped once merged.
  Tensor forward(const Tensor& x);
  // The same two summands apart.
  LoRAParts forward_parts(const Tensor& x);
  // Note [Adapters of one input]: projections of one input (an attention's q, k and v) whose adapters are all
  // unmerged, without active dropout and of one scale, dtype and compute dtype run their A-products as one: x
  // times the A weights concatenated ([sum of ranks, in]), so x is read once, and the backward's A-gradient and
  // input-gradient products are one each instead of one per adapter (the 8B LoRA step ran 768 rank-8 products of
  // 9-20 us: bench/RESULTS.md 2026-11-27, twenty-first session). The same sums per projection as forward() (a
  // product of another width may add them in another order). Otherwise, or with INGOT_LORA_SHARED_A=0,
  // forward_parts() of each. Each projection's summands apart (LoRAParts::sum() is its forward()).
  static std::vector<LoRAParts> forward_shared_input_parts(const std::vector<LoRALinear*>& projections,
                                                           const Tensor& x);
  // W + scale * B A as a new tensor (no gradient); the weight itself without an adapter.
  Tensor merged_weight() const;
  // Folds the adapter into the weight in place (inference / export); forward then skips it.
  void merge();
  bool merged() const { return merged_; }
  // Replaces the base product x W^T with `base` (null goes back to `weight`); the caller owns what happens to
  // `weight`'s values (models/qlora.cpp empties it). merge() is then an error: export merged_weight().
  void set_frozen_base(std::shared_ptr<const FrozenBase> base) { frozen_base_ = std::move(base); }
  const std::shared_ptr<const FrozenBase>& frozen_base() const { return frozen_base_; }

 private:
  Tensor base_forward(const Tensor& x);  // x W^T + b, through the frozen base when there is one
  std::shared_ptr<Linear> lora_a_, lora_b_;
  std::shared_ptr<Dropout> lora_dropout_;
  double scale_ = 0.0;
  bool merged_ = false;
  std::shared_ptr<const FrozenBase> frozen_base_;
};

// Adds adapters to every LoRALinear of `model` whose last name component is in cfg.target_modules and freezes
// every other parameter. Errors: a target that matches no LoRALinear (listing the projections there are),
// rank < 1, alpha <= 0, dropout outside [0, 1). Returns the adapted module names.
std::vector<std::string> apply_lora(Module& model, const LoRAConfig& cfg);

// Parameters with requires_grad (what an optimizer should get after apply_lora).
std::vector<Tensor> trainable_parameters(const Module& model);

// The adapter tensors only: "<module>.lora_A.weight" / "<module>.lora_B.weight" (handles, not copies).
std::vector<std::pair<std::string, Tensor>> lora_state_dict(const Module& model);

// The state dict with every adapter folded into its base weight and no lora_* entries: what an export writes
// (a quantized base is written dequantized).
std::map<std::string, Tensor> merged_state_dict(const Module& model);

}  // namespace ingot::nn
