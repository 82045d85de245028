// Layers built from autograd/ops.h. Parameters are created in f32 on the CPU; move or cast them with
// Module::to. Parameter names follow PyTorch / Hugging Face (weight, bias, c_attn, q_proj, ...).
//
// Initialization: `init_std` set means normal(0, init_std) weights and zero biases (GPT-2 / Llama style);
// unset means PyTorch's default for the layer (Linear: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias).
#pragma once

#include <optional>

#include "autograd/nn/module.h"

namespace ingot::nn {

// y = x @ W^T + b; W [out, in], b [out].
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, std::optional<double> init_std = std::nullopt);
  Tensor forward(const Tensor& x);
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  int64_t in_, out_;
  Tensor weight_, bias_;
};

// ids [...] (i64/i32) -> [..., dim]; weight [num, dim] ~ normal(0, init_std) (PyTorch default std 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, double init_std = 1.0);
  Tensor forward(const Tensor& ids);
  const Tensor& weight() const { return weight_; }

 private:
  Tensor weight_;
};

// Over the last dim; weight = 1, bias = 0 when affine.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x);

 private:
  double eps_;
  Tensor weight_, bias_;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x);

 private:
  double eps_;
  Tensor weight_;
};

// Active only in training mode.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.0);
  Tensor forward(const Tensor& x);

 private:
  double p_;
};

// GPT-2 MLP: c_proj(gelu_tanh(c_fc(x))), then dropout. proj_init_std lets GPT-2 scale the residual projection.
class MLP : public Module {
 public:
  MLP(int64_t dim, int64_t hidden, double dropout = 0.0, std::optional<double> init_std = std::nullopt,
      std::optional<double> proj_init_std = std::nullopt);
  Tensor forward(const Tensor& x);

 private:
  std::shared_ptr<Linear> c_fc_, c_proj_;
  std::shared_ptr<Dropout> dropout_;
};

// Llama MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), no biases unless asked.
class SwiGLU : public Module {
 public:
  SwiGLU(int64_t dim, int64_t hidden, bool bias = false, std::optional<double> init_std = std::nullopt);
  Tensor forward(const Tensor& x);

 private:
  std::shared_ptr<Linear> gate_proj_, up_proj_, down_proj_;
};

struct AttentionConfig {
  int64_t dim = 0;
  int64_t n_head = 1;
  int64_t n_kv_head = 0;       // 0 means n_head (MHA); fewer is GQA, 1 is MQA
  bool fused_qkv = false;      // GPT-2: c_attn [3*dim, dim] + c_proj; else q_proj/k_proj/v_proj + o_proj
  bool qkv_bias = false;       // biases on the q, k, v projections (GPT-2, Qwen2)
  bool out_bias = false;       // bias on the output projection (GPT-2)
  bool rope = false;           // rotary embedding on q and k (Llama/NeoX pair layout)
  double rope_theta = 10000.0;
  double dropout = 0.0;        // on the output projection (residual dropout)
  std::optional<double> init_std;      // q/k/v (or c_attn) init
  std::optional<double> out_init_std;  // output projection init
};

// Causal multi-head attention over x [B, T, dim] -> [B, T, dim].
class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const AttentionConfig& cfg);
  Tensor forward(const Tensor& x);
  const AttentionConfig& config() const { return cfg_; }

 private:
  std::pair<Tensor, Tensor> rope_for(int64_t seq_len, Device device);

  AttentionConfig cfg_;
  int64_t head_dim_;
  std::shared_ptr<Linear> c_attn_, q_proj_, k_proj_, v_proj_, out_proj_;
  std::shared_ptr<Dropout> dropout_;
  // RoPE tables for the last (seq_len, device), reused across steps; not part of the state dict.
  Tensor rope_cos_, rope_sin_;
};

struct BlockConfig {
  enum class Style {
    GPT2,   // ln_1, attn (fused c_attn), ln_2, mlp (c_fc/c_proj, gelu); LayerNorm with bias
    Llama,  // input_layernorm, self_attn (q/k/v/o_proj, RoPE, GQA), post_attention_layernorm, mlp (SwiGLU)
  };
  Style style = Style::GPT2;
  AttentionConfig attn;
  int64_t intermediate = 0;  // MLP hidden size
  double norm_eps = 1e-5;
  double dropout = 0.0;      // residual dropout after the MLP (attention has its own in attn.dropout)
  std::optional<double> init_std, out_init_std;  // MLP up / down projection init
};

// Pre-norm residual block: x + attn(norm1(x)), then h + mlp(norm2(h)).
class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const BlockConfig& cfg);
  Tensor forward(const Tensor& x);

 private:
  Tensor norm(int which, const Tensor& x);

  BlockConfig cfg_;
  std::shared_ptr<LayerNorm> ln1_, ln2_;   // GPT2 style
  std::shared_ptr<RMSNorm> rms1_, rms2_;   // Llama style
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<MLP> mlp_;
  std::shared_ptr<SwiGLU> swiglu_;
};

}  // namespace ingot::nn
