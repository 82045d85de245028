#include "models/llama.h"

namespace ingot::models {

LlamaModel::LlamaModel(const LlamaConfig& cfg) : cfg_(cfg) {
  INGOT_CHECK(cfg.vocab_size > 0 && cfg.num_hidden_layers > 0 && cfg.intermediate_size > 0,
              "Llama: vocab_size, num_hidden_layers and intermediate_size must be positive");
  INGOT_CHECK(cfg.num_attention_heads > 0 && (cfg.head_dim > 0 || cfg.hidden_size % cfg.num_attention_heads == 0),
              "Llama: hidden_size (", cfg.hidden_size, ") must be a multiple of num_attention_heads (",
              cfg.num_attention_heads, ")");
  const double std = cfg.initializer_range;
  embed_tokens_ = register_module("embed_tokens", std::make_shared<nn::Embedding>(cfg.vocab_size, cfg.hidden_size, std));

  DecoderConfig b;
  b.style = DecoderConfig::Style::Llama;
  b.dim = cfg.hidden_size;
  b.n_head = cfg.num_attention_heads;
  b.n_kv_head = cfg.num_key_value_heads;
  b.head_dim = cfg.head_dim;
  b.qkv_bias = cfg.attention_bias;
  b.out_bias = cfg.attention_out_bias;
  b.mlp_bias = cfg.mlp_bias;
  b.rope = true;
  b.qk_norm = cfg.qk_norm;
  b.rope_theta = cfg.rope_theta;
  b.rope_scaling = cfg.rope_scaling;
  b.sliding_window = cfg.sliding_window;
  b.init_std = b.out_init_std = std;
  b.intermediate = cfg.intermediate_size;
  b.norm_eps = cfg.rms_norm_eps;
  auto layers = register_module("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i)
    layers_.push_back(layers->append(std::make_shared<DecoderBlock>(b)));
  norm_ = register_module("norm", std::make_shared<nn::RMSNorm>(cfg.hidden_size, cfg.rms_norm_eps));
}

Tensor LlamaModel::forward(const Tensor& ids, KVCache* cache, const Tensor& positions) {
  INGOT_CHECK(ids.dim() == 2 && is_integral(ids.dtype()), "Llama: expected ids [B, T] of an integer type, got ",
              dtype_name(ids.dtype()), shape_str(ids.shape()));
  const int64_t T = ids.size(1), start = cache ? cache->length() : 0;
  INGOT_CHECK(start + T <= cfg_.max_position_embeddings, "Llama: sequence length ", start + T,
              " exceeds max_position_embeddings ", cfg_.max_position_embeddings);
  Tensor x = embed_tokens_->forward(ids);
  for (size_t i = 0; i < layers_.size(); ++i) x = layers_[i]->forward(x, cache, i, positions);
  if (cache) cache->advance(T);
  return norm_->forward(x);
}

Llama::Llama(const LlamaConfig& cfg) : cfg_(cfg) {
  model_ = register_module("model", std::make_shared<LlamaModel>(cfg));
  if (!cfg.tie_word_embeddings)
    lm_head_ = register_module("lm_head", std::make_shared<nn::LoRALinear>(cfg.hidden_size, cfg.vocab_size, false,
                                                                           cfg.initializer_range));
  set_tensor_names();
}

Tensor Llama::head(const Tensor& h) {
  if (lm_head_) return lm_head_->forward(h);
  auto c = compute_dtype();
  return linear(nn::maybe_cast(h, c), nn::maybe_cast(model_->embed_tokens().weight(), c));
}

Tensor Llama::hidden_states(const Tensor& ids, const Tensor& positions) { return model_->forward(ids, nullptr, positions); }

Tensor Llama::tied_head_weight() const { return lm_head_ ? Tensor() : model_->embed_tokens().weight(); }

Tensor Llama::forward(const Tensor& ids, const Tensor& positions) {
  return with_forward_hooks([&] { return head(model_->forward(ids, nullptr, positions)); });
}

Tensor Llama::forward_cached(const Tensor& ids, KVCache& cache) {
  return with_forward_hooks([&] { return head(model_->forward(ids, &cache)); });
}

}  // namespace ingot::models
