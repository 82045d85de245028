// GPT-2 (Radford et al. 2019): learned token and position embeddings, pre-norm blocks with a fused qkv
// projection and a GELU(tanh) MLP, final LayerNorm, LM head tied to the token embedding.
//
// Parameter names follow Hugging Face's GPT2LMHeadModel (transformer.wte.weight, transformer.h.0.attn.c_attn.weight,
// ...), but every projection is stored as a Linear [out, in]; HF's Conv1D [in, out] checkpoints are transposed
// by models/hf_checkpoint.h on load and save. With tied embeddings there is no lm_head parameter.
#pragma once

#include <memory>

#include "models/causal_lm.h"
#include "models/decoder.h"

namespace ingot::models {

struct GPT2Config {
  int64_t vocab_size = 50257, n_positions = 1024, n_embd = 768, n_layer = 12, n_head = 12;
  int64_t n_inner = 0;  // MLP hidden size; 0 means 4 * n_embd
  double dropout = 0.0, layer_norm_eps = 1e-5;
  bool tie_word_embeddings = true;
  double initializer_range = 0.02;  // normal(0, std) init; residual projections get std / sqrt(2 * n_layer)
};

// The trunk ("transformer"): ids [B, T] -> hidden states [B, T, n_embd] after ln_f.
class GPT2Model : public nn::Module {
 public:
  explicit GPT2Model(const GPT2Config& cfg);
  // positions [B, T]: learned positions of packed documents (CausalLM::forward); undefined: 0..T-1 after the cache.
  Tensor forward(const Tensor& ids, KVCache* cache = nullptr, const Tensor& positions = Tensor());
  const nn::Embedding& wte() const { return *wte_; }

 private:
  GPT2Config cfg_;
  std::shared_ptr<nn::Embedding> wte_, wpe_;
  std::shared_ptr<nn::Dropout> drop_;
  std::vector<std::shared_ptr<DecoderBlock>> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
};

class GPT2 : public CausalLM {
 public:
  explicit GPT2(const GPT2Config& cfg);
  using CausalLM::forward;
  // ids [B, T] i64 -> logits [B, T, vocab_size]; positions as in CausalLM.
  Tensor forward(const Tensor& ids, const Tensor& positions) override;
  Tensor forward_cached(const Tensor& ids, KVCache& cache) override;
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_positions() const override { return cfg_.n_positions; }
  const GPT2Config& config() const { return cfg_; }

 protected:
  Tensor hidden_states(const Tensor& ids, const Tensor& positions) override;
  nn::LoRALinear* untied_head() override { return lm_head_.get(); }
  Tensor tied_head_weight() const override;

 private:
  Tensor head(const Tensor& h);

  GPT2Config cfg_;
  std::shared_ptr<GPT2Model> transformer_;
  std::shared_ptr<nn::LoRALinear> lm_head_;  // null when tied
};

}  // namespace ingot::models
