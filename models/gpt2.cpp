#include "models/gpt2.h"

#include <cmath>

namespace ingot::models {

GPT2Model::GPT2Model(const GPT2Config& cfg) : cfg_(cfg) {
  INGOT_CHECK(cfg.vocab_size > 0 && cfg.n_positions > 0 && cfg.n_layer > 0,
              "GPT2: vocab_size, n_positions and n_layer must be positive");
  INGOT_CHECK(cfg.n_head > 0 && cfg.n_embd % cfg.n_head == 0, "GPT2: n_embd (", cfg.n_embd,
              ") must be a multiple of n_head (", cfg.n_head, ")");
  const double std = cfg.initializer_range;
  wte_ = register_module("wte", std::make_shared<nn::Embedding>(cfg.vocab_size, cfg.n_embd, std));
  wpe_ = register_module("wpe", std::make_shared<nn::Embedding>(cfg.n_positions, cfg.n_embd, std));
  drop_ = register_module("drop", std::make_shared<nn::Dropout>(cfg.dropout));

  // GPT-2 paper: residual projections are scaled by 1/sqrt(N) with N the number of residual layers (2 per block).
  DecoderConfig b;
  b.style = DecoderConfig::Style::GPT2;
  b.dim = cfg.n_embd;
  b.n_head = cfg.n_head;
  b.fused_qkv = true;
  b.qkv_bias = b.out_bias = true;
  b.dropout = cfg.dropout;
  b.init_std = std;
  b.out_init_std = std / std::sqrt(2.0 * static_cast<double>(cfg.n_layer));
  b.intermediate = cfg.n_inner > 0 ? cfg.n_inner : 4 * cfg.n_embd;
  b.norm_eps = cfg.layer_norm_eps;
  auto h = register_module("h", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < cfg.n_layer; ++i) blocks_.push_back(h->append(std::make_shared<DecoderBlock>(b)));
  ln_f_ = register_module("ln_f", std::make_shared<nn::LayerNorm>(cfg.n_embd, cfg.layer_norm_eps));
}

Tensor GPT2Model::forward(const Tensor& ids, KVCache* cache, const Tensor& positions) {
  INGOT_CHECK(ids.dim() == 2 && is_integral(ids.dtype()), "GPT2: expected ids [B, T] of an integer type, got ",
              dtype_name(ids.dtype()), shape_str(ids.shape()));
  const int64_t T = ids.size(1), start = cache ? cache->length() : 0;
  INGOT_CHECK(start + T <= cfg_.n_positions, "GPT2: sequence length ", start + T, " exceeds n_positions ",
              cfg_.n_positions);
  Tensor pos = positions.defined() ? positions : arange(start, start + T, DType::i64, ids.device());
  Tensor x = drop_->forward(add(wte_->forward(ids), wpe_->forward(pos)));
  for (size_t i = 0; i < blocks_.size(); ++i) x = blocks_[i]->forward(x, cache, i, positions);
  if (cache) cache->advance(T);
  return ln_f_->forward(x);
}

GPT2::GPT2(const GPT2Config& cfg) : cfg_(cfg) {
  transformer_ = register_module("transformer", std::make_shared<GPT2Model>(cfg));
  if (!cfg.tie_word_embeddings)
    lm_head_ = register_module("lm_head", std::make_shared<nn::LoRALinear>(cfg.n_embd, cfg.vocab_size, false,
                                                                           cfg.initializer_range));
  set_tensor_names();
}

Tensor GPT2::head(const Tensor& h) {
  if (lm_head_) return lm_head_->forward(h);
  auto c = compute_dtype();
  return linear(nn::maybe_cast(h, c), nn::maybe_cast(transformer_->wte().weight(), c));
}

Tensor GPT2::hidden_states(const Tensor& ids, const Tensor& positions) { return transformer_->forward(ids, nullptr, positions); }

Tensor GPT2::tied_head_weight() const { return lm_head_ ? Tensor() : transformer_->wte().weight(); }

Tensor GPT2::forward(const Tensor& ids, const Tensor& positions) {
  return with_forward_hooks([&] { return head(transformer_->forward(ids, nullptr, positions)); });
}

Tensor GPT2::forward_cached(const Tensor& ids, KVCache& cache) {
  return with_forward_hooks([&] { return head(transformer_->forward(ids, &cache)); });
}

}  // namespace ingot::models
