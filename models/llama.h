// The Llama decoder family (Llama 2/3/3.x, Mistral, Qwen2/2.5, SmolLM): token embedding, pre-norm blocks with
// RMSNorm, rotary embeddings (optionally scaled), grouped-query attention and a SwiGLU MLP, final RMSNorm, LM
// head (tied or not). Parameter names follow Hugging Face's LlamaForCausalLM: model.embed_tokens.weight,
// model.layers.0.self_attn.q_proj.weight, ..., model.norm.weight, lm_head.weight (absent when tied).
#pragma once

#include <memory>
#include <string>

#include "models/causal_lm.h"
#include "models/decoder.h"

namespace ingot::models {

struct LlamaConfig {
  int64_t vocab_size = 32000, hidden_size = 4096, intermediate_size = 11008, num_hidden_layers = 32,
          num_attention_heads = 32, num_key_value_heads = 32;
  int64_t head_dim = 0;  // 0 means hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 2048;
  int64_t sliding_window = 0;       // Mistral; 0 means none
  bool tie_word_embeddings = false;
  bool attention_bias = false;      // biases on q/k/v_proj (Qwen2)
  bool attention_out_bias = false;  // bias on o_proj (HF Llama's attention_bias sets both)
  bool mlp_bias = false;            // biases on gate/up/down_proj (HF Llama's mlp_bias)
  bool qk_norm = false;             // an RMSNorm over each head of q and k before RoPE (Qwen3)
  double initializer_range = 0.02;
  std::string model_type = "llama";  // Hugging Face model_type written on export: llama, mistral, qwen2 or qwen3
};

// The trunk ("model"): ids [B, T] -> hidden states [B, T, hidden_size] after the final norm.
class LlamaModel : public nn::Module {
 public:
  explicit LlamaModel(const LlamaConfig& cfg);
  // positions [B, T]: rotary positions of packed documents (CausalLM::forward); undefined: 0..T-1 after the cache.
  Tensor forward(const Tensor& ids, KVCache* cache = nullptr, const Tensor& positions = Tensor());
  const nn::Embedding& embed_tokens() const { return *embed_tokens_; }

 private:
  LlamaConfig cfg_;
  std::shared_ptr<nn::Embedding> embed_tokens_;
  std::vector<std::shared_ptr<DecoderBlock>> layers_;
  std::shared_ptr<nn::RMSNorm> norm_;
};

class Llama : public CausalLM {
 public:
  explicit Llama(const LlamaConfig& cfg);
  using CausalLM::forward;
  // ids [B, T] i64 -> logits [B, T, vocab_size]; positions as in CausalLM.
  Tensor forward(const Tensor& ids, const Tensor& positions) override;
  Tensor forward_cached(const Tensor& ids, KVCache& cache) override;
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_positions() const override { return cfg_.max_position_embeddings; }
  const LlamaConfig& config() const { return cfg_; }

 protected:
  Tensor hidden_states(const Tensor& ids, const Tensor& positions) override;
  nn::LoRALinear* untied_head() override { return lm_head_.get(); }
  Tensor tied_head_weight() const override;

 private:
  Tensor head(const Tensor& h);

  LlamaConfig cfg_;
  std::shared_ptr<LlamaModel> model_;
  std::shared_ptr<nn::LoRALinear> lm_head_;  // null when tied
};

}  // namespace ingot::models
