#include "autograd/nn/layers.h"

#include <cmath>

namespace ingot::nn {
namespace {

Tensor normal_init(const Shape& shape, double std) { return randn(shape, DType::f32, Device::cpu(), 0.0, std); }

}  // namespace

// Linear ---------------------------------------------------------------------------------------------------

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, std::optional<double> init_std)
    : in_(in_features), out_(out_features) {
  INGOT_CHECK(in_features > 0 && out_features > 0, "Linear: expected positive sizes, got in=", in_features,
              " out=", out_features);
  if (init_std) {
    weight_ = register_parameter("weight", normal_init({out_, in_}, *init_std));
    if (bias) bias_ = register_parameter("bias", zeros({out_}));
  } else {
    // PyTorch's kaiming_uniform_(a=sqrt(5)) reduces to U(-1/sqrt(in), 1/sqrt(in)); the bias uses the same bound.
    double bound = 1.0 / std::sqrt(static_cast<double>(in_));
    weight_ = register_parameter("weight", rand({out_, in_}, DType::f32, Device::cpu(), -bound, bound));
    if (bias) bias_ = register_parameter("bias", rand({out_}, DType::f32, Device::cpu(), -bound, bound));
  }
}

Tensor Linear::forward(const Tensor& x) {
  INGOT_CHECK(x.dim() >= 1 && x.size(-1) == in_, "Linear: expected input [..., ", in_, "], got ",
              shape_str(x.shape()));
  auto c = compute_dtype();
  return linear(maybe_cast(x, c), maybe_cast(weight_, c), maybe_cast(bias_, c));
}

// Embedding, norms, dropout ------------------------------------------------------------------------------------

Embedding::Embedding(int64_t num_embeddings, int64_t dim, double init_std) {
  INGOT_CHECK(num_embeddings > 0 && dim > 0, "Embedding: expected positive sizes, got ", num_embeddings, " x ", dim);
  weight_ = register_parameter("weight", normal_init({num_embeddings, dim}, init_std));
}

Tensor Embedding::forward(const Tensor& ids) { return embedding(weight_, ids); }

LayerNorm::LayerNorm(int64_t dim, double eps, bool affine) : eps_(eps) {
  if (affine) {
    weight_ = register_parameter("weight", ones({dim}));
    bias_ = register_parameter("bias", zeros({dim}));
  }
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, weight_, bias_, eps_); }

RMSNorm::RMSNorm(int64_t dim, double eps) : eps_(eps) { weight_ = register_parameter("weight", ones({dim})); }

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, weight_, eps_); }

Dropout::Dropout(double p) : p_(p) {
  INGOT_CHECK(p >= 0.0 && p < 1.0, "Dropout: expected 0 <= p < 1, got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0.0) return x;
  return dropout(x, p_, true);
}

// MLPs ---------------------------------------------------------------------------------------------------------

MLP::MLP(int64_t dim, int64_t hidden, double dropout, std::optional<double> init_std,
         std::optional<double> proj_init_std) {
  c_fc_ = register_module("c_fc", std::make_shared<Linear>(dim, hidden, true, init_std));
  c_proj_ = register_module("c_proj", std::make_shared<Linear>(hidden, dim, true, proj_init_std));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(dropout));
}

Tensor MLP::forward(const Tensor& x) { return dropout_->forward(c_proj_->forward(gelu(c_fc_->forward(x), true))); }

SwiGLU::SwiGLU(int64_t dim, int64_t hidden, bool bias, std::optional<double> init_std) {
  gate_proj_ = register_module("gate_proj", std::make_shared<Linear>(dim, hidden, bias, init_std));
  up_proj_ = register_module("up_proj", std::make_shared<Linear>(dim, hidden, bias, init_std));
  down_proj_ = register_module("down_proj", std::make_shared<Linear>(hidden, dim, bias, init_std));
}

Tensor SwiGLU::forward(const Tensor& x) {
  return down_proj_->forward(mul(silu(gate_proj_->forward(x)), up_proj_->forward(x)));
}

// Attention ----------------------------------------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(const AttentionConfig& cfg) : cfg_(cfg) {
  if (cfg_.n_kv_head == 0) cfg_.n_kv_head = cfg_.n_head;
  INGOT_CHECK(cfg_.dim > 0 && cfg_.n_head > 0 && cfg_.dim % cfg_.n_head == 0,
              "CausalSelfAttention: dim (", cfg_.dim, ") must be a positive multiple of n_head (", cfg_.n_head, ")");
  INGOT_CHECK(cfg_.n_kv_head > 0 && cfg_.n_head % cfg_.n_kv_head == 0, "CausalSelfAttention: n_head (",
              cfg_.n_head, ") must be a multiple of n_kv_head (", cfg_.n_kv_head, ")");
  head_dim_ = cfg_.dim / cfg_.n_head;
  INGOT_CHECK(!cfg_.rope || head_dim_ % 2 == 0, "CausalSelfAttention: RoPE needs an even head dim, got ", head_dim_);
  const int64_t kv_dim = cfg_.n_kv_head * head_dim_;
  if (cfg_.fused_qkv) {
    c_attn_ = register_module("c_attn",
                              std::make_shared<Linear>(cfg_.dim, cfg_.dim + 2 * kv_dim, cfg_.qkv_bias, cfg_.init_std));
    out_proj_ = register_module("c_proj", std::make_shared<Linear>(cfg_.dim, cfg_.dim, cfg_.out_bias, cfg_.out_init_std));
  } else {
    q_proj_ = register_module("q_proj", std::make_shared<Linear>(cfg_.dim, cfg_.dim, cfg_.qkv_bias, cfg_.init_std));
    k_proj_ = register_module("k_proj", std::make_shared<Linear>(cfg_.dim, kv_dim, cfg_.qkv_bias, cfg_.init_std));
    v_proj_ = register_module("v_proj", std::make_shared<Linear>(cfg_.dim, kv_dim, cfg_.qkv_bias, cfg_.init_std));
    out_proj_ = register_module("o_proj", std::make_shared<Linear>(cfg_.dim, cfg_.dim, cfg_.out_bias, cfg_.out_init_std));
  }
  dropout_ = register_module("resid_dropout", std::make_shared<Dropout>(cfg_.dropout));
}

std::pair<Tensor, Tensor> CausalSelfAttention::rope_for(int64_t seq_len, Device device) {
  if (!rope_cos_.defined() || rope_cos_.size(0) != seq_len || !(rope_cos_.device() == device))
    std::tie(rope_cos_, rope_sin_) = rope_tables(seq_len, head_dim_, cfg_.rope_theta, device);
  return {rope_cos_, rope_sin_};
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  INGOT_CHECK(x.dim() == 3 && x.size(2) == cfg_.dim, "CausalSelfAttention: expected x [B, T, ", cfg_.dim, "], got ",
              shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), kv_dim = cfg_.n_kv_head * head_dim_;
  Tensor q, k, v;
  if (c_attn_) {
    std::vector<Tensor> parts = split_sizes(c_attn_->forward(x), {cfg_.dim, kv_dim, kv_dim}, -1);
    q = parts[0], k = parts[1], v = parts[2];
  } else {
    q = q_proj_->forward(x), k = k_proj_->forward(x), v = v_proj_->forward(x);
  }
  // [B, T, H*D] -> [B, H, T, D]
  auto heads = [&](const Tensor& t, int64_t h) { return transpose(reshape(t, {B, T, h, head_dim_}), 1, 2); };
  q = heads(q, cfg_.n_head);
  k = heads(k, cfg_.n_kv_head);
  v = heads(v, cfg_.n_kv_head);
  if (cfg_.rope) {
    auto [cos_t, sin_t] = rope_for(T, x.device());
    q = rotary_embedding(q, cos_t, sin_t);
    k = rotary_embedding(k, cos_t, sin_t);
  }
  Tensor y = scaled_dot_product_attention(q, k, v, /*causal=*/true);
  y = reshape(transpose(y, 1, 2), {B, T, cfg_.dim});
  return dropout_->forward(out_proj_->forward(y));
}

// Transformer block ----------------------------------------------------------------------------------------

TransformerBlock::TransformerBlock(const BlockConfig& cfg) : cfg_(cfg) {
  const int64_t dim = cfg_.attn.dim;
  if (cfg_.style == BlockConfig::Style::GPT2) {
    ln1_ = register_module("ln_1", std::make_shared<LayerNorm>(dim, cfg_.norm_eps));
    attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(cfg_.attn));
    ln2_ = register_module("ln_2", std::make_shared<LayerNorm>(dim, cfg_.norm_eps));
    mlp_ = register_module("mlp", std::make_shared<MLP>(dim, cfg_.intermediate, cfg_.dropout, cfg_.init_std,
                                                        cfg_.out_init_std));
  } else {
    rms1_ = register_module("input_layernorm", std::make_shared<RMSNorm>(dim, cfg_.norm_eps));
    attn_ = register_module("self_attn", std::make_shared<CausalSelfAttention>(cfg_.attn));
    rms2_ = register_module("post_attention_layernorm", std::make_shared<RMSNorm>(dim, cfg_.norm_eps));
    swiglu_ = register_module("mlp", std::make_shared<SwiGLU>(dim, cfg_.intermediate, false, cfg_.init_std));
  }
}

Tensor TransformerBlock::norm(int which, const Tensor& x) {
  if (ln1_) return (which == 1 ? ln1_ : ln2_)->forward(x);
  return (which == 1 ? rms1_ : rms2_)->forward(x);
}

Tensor TransformerBlock::forward(const Tensor& x) {
  Tensor h = add(x, attn_->forward(norm(1, x)));
  Tensor m = mlp_ ? mlp_->forward(norm(2, h)) : swiglu_->forward(norm(2, h));
  return add(h, m);
}

}  // namespace ingot::nn
