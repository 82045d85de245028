// Decoder building blocks shared by GPT-2 and the Llama family: attention with rotary scaling and a KV cache,
// the two MLP styles and the pre-norm block. Every projection is an nn::LoRALinear, so LoRA adapters can be
// added to any of them after construction (autograd/nn/lora.h). Names follow Hugging Face (c_attn, q_proj, ...).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "autograd/nn/layers.h"
#include "autograd/nn/lora.h"

namespace ingot::models {

// HF config.json "rope_scaling" (transformers' modeling_rope_utils): none, "linear" (positions / factor) or
// "llama3" (long wavelengths / factor, short ones kept, a smooth blend between).
struct RopeScaling {
  enum class Kind { None, Linear, Llama3 };
  Kind kind = Kind::None;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// inv_freq [head_dim / 2] (f32) computed in f32 in transformers' order of operations.
Tensor rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling);

// Keys and values of the tokens seen so far, per layer, for incremental decoding. A model's forward with a
// cache attends over the cached tokens plus the new ones, places the new ones at positions length()...,
// appends their keys and values and advances length().
class KVCache {
 public:
  int64_t length() const { return length_; }
  void clear() {
    k_.clear();
    v_.clear();
    length_ = 0;
  }
  // Layer `layer`'s keys / values [B, Hkv, length + T, D] after appending k, v [B, Hkv, T, D].
  std::pair<Tensor, Tensor> append(size_t layer, const Tensor& k, const Tensor& v);
  void advance(int64_t t) { length_ += t; }

 private:
  std::vector<Tensor> k_, v_;
  int64_t length_ = 0;
};

struct DecoderConfig {
  enum class Style { GPT2, Llama };
  Style style = Style::GPT2;
  int64_t dim = 0, n_head = 1, n_kv_head = 0, head_dim = 0;  // 0: n_head / dim / n_head
  int64_t intermediate = 0;
  bool fused_qkv = false;  // GPT-2's c_attn
  bool qkv_bias = false, out_bias = false, mlp_bias = false;
  bool rope = false;
  bool qk_norm = false;  // Qwen3: an RMSNorm over each head of q and of k (weights [head_dim]) before RoPE
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t sliding_window = 0;  // 0: none; longer contexts are refused rather than silently attended in full
  double norm_eps = 1e-5;
  double dropout = 0.0;
  std::optional<double> init_std, out_init_std;  // projections into / out of the residual stream
};

// A filled-in copy: n_kv_head and head_dim defaults resolved, sizes checked.
DecoderConfig resolved(DecoderConfig cfg);

class Attention : public nn::Module {
 public:
  explicit Attention(const DecoderConfig& cfg);
  // x [B, T, dim] at positions start..start+T-1 -> [B, T, dim]. With a cache, attends over its `layer` entry too.
  // positions [B, T] (no cache): packed documents, each token at its position within its document and
  // attending only inside it (CausalLM::forward).
  Tensor forward(const Tensor& x, KVCache* cache = nullptr, size_t layer = 0, const Tensor& positions = Tensor());
  // The same as the output projection's base and adapter update apart (Note [Residual of a sum], decoder.cpp).
  nn::LoRAParts forward_parts(const Tensor& x, KVCache* cache = nullptr, size_t layer = 0,
                              const Tensor& positions = Tensor());

 private:
  std::pair<Tensor, Tensor> rope_for(int64_t start, int64_t len, Device device);

  DecoderConfig cfg_;
  std::shared_ptr<nn::LoRALinear> c_attn_, q_proj_, k_proj_, v_proj_, out_proj_;
  std::shared_ptr<nn::RMSNorm> q_norm_, k_norm_;  // cfg_.qk_norm only
  std::shared_ptr<nn::Dropout> dropout_;
  Tensor inv_freq_;              // f32, host; undefined without rope scaling
  Tensor rope_cos_, rope_sin_;   // positions [0, rope_cos_.size(0)); not part of the state dict
};

// GPT-2: c_proj(gelu_tanh(c_fc(x))) then dropout. Llama: down_proj(silu(gate_proj(x)) * up_proj(x)).
class DecoderMLP : public nn::Module {
 public:
  explicit DecoderMLP(const DecoderConfig& cfg);
  Tensor forward(const Tensor& x);
  // The same as the last projection's base and adapter update apart (Note [Residual of a sum], decoder.cpp).
  nn::LoRAParts forward_parts(const Tensor& x);
  // forward_parts(x) in its two halves: the up-projections and the activation, [..., intermediate], then the last
  // projection (and GPT-2's dropout) of that. The block checkpoints the first (Note [MLP checkpointing]).
  Tensor widen(const Tensor& x);
  nn::LoRAParts narrow(const Tensor& h);

 private:
  std::shared_ptr<nn::LoRALinear> c_fc_, c_proj_, gate_proj_, up_proj_, down_proj_;
  std::shared_ptr<nn::Dropout> dropout_;
};

// What a block's backward runs again instead of keeping it from the forward (train.activation_checkpointing;
// autograd/checkpoint.h, traced, a compiled step does the same): nothing; the whole block (it keeps only its input);
// or the MLP's norm, up-projections and activation (Note [MLP checkpointing], decoder.cpp).
enum class Checkpointing { none, blocks, mlp };

// Pre-norm residual block: x + attn(norm1(x)), then h + mlp(norm2(h)).
class DecoderBlock : public nn::Module {
 public:
  explicit DecoderBlock(const DecoderConfig& cfg);
  Tensor forward(const Tensor& x, KVCache* cache = nullptr, size_t layer = 0, const Tensor& positions = Tensor());
  void set_checkpointing(Checkpointing mode) { checkpointing_ = mode; }

 private:
  Tensor norm(int which, const Tensor& x);
  Tensor body(const Tensor& x, KVCache* cache, size_t layer, const Tensor& positions);

  Checkpointing checkpointing_ = Checkpointing::none;

  std::shared_ptr<nn::LayerNorm> ln1_, ln2_;
  std::shared_ptr<nn::RMSNorm> rms1_, rms2_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<DecoderMLP> mlp_;
};

// Sets `mode` on the first `count` DecoderBlocks under `model` in their order (every one when count is 0) and
// Checkpointing::none on the others: train.activation_checkpointing and train.activation_checkpointing_layers.
// Returns how many blocks got `mode` (0 for none).
int64_t set_checkpointing(nn::Module& model, Checkpointing mode, int64_t count = 0);

}  // namespace ingot::models
