#include "models/decoder.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "autograd/checkpoint.h"

namespace ingot::models {

// Follows transformers' _compute_default_rope_parameters / _compute_linear_scaling_rope_parameters /
// _compute_llama3_parameters, all of which work on f32 tensors.
Tensor rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& s) {
  INGOT_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be positive and even, got ", head_dim);
  INGOT_CHECK(theta > 0, "rope: rope_theta must be positive, got ", theta);
  const int64_t half = head_dim / 2;
  std::vector<double> out(static_cast<size_t>(half));
  const float pi2 = static_cast<float>(2.0 * M_PI);
  for (int64_t i = 0; i < half; ++i) {
    float f = 1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(head_dim));
    if (s.kind == RopeScaling::Kind::Linear) {
      f = f / static_cast<float>(s.factor);
    } else if (s.kind == RopeScaling::Kind::Llama3) {
      const float factor = static_cast<float>(s.factor), lo = static_cast<float>(s.low_freq_factor),
                  hi = static_cast<float>(s.high_freq_factor);
      const float old_len = static_cast<float>(s.original_max_position_embeddings);
      const float low_freq_wavelen = old_len / lo, high_freq_wavelen = old_len / hi;
      const float wavelen = pi2 / f;
      float scaled = wavelen > low_freq_wavelen ? f / factor : f;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      if (medium) {
        const float smooth = (old_len / wavelen - lo) / (hi - lo);
        scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
      }
      f = scaled;
    }
    out[static_cast<size_t>(i)] = f;
  }
  return from_vector(out, {half}, DType::f32);
}

std::pair<Tensor, Tensor> KVCache::append(size_t layer, const Tensor& k, const Tensor& v) {
  if (k_.size() <= layer) {
    k_.resize(layer + 1);
    v_.resize(layer + 1);
  }
  INGOT_CHECK(!k_[layer].defined() || k_[layer].size(2) == length_, "KVCache: layer ", layer, " holds ",
              k_[layer].defined() ? k_[layer].size(2) : 0, " tokens but the cache length is ", length_,
              " (a forward with this cache was interrupted, or the cache belongs to another model)");
  if (k_[layer].defined()) {
    INGOT_CHECK(k_[layer].size(0) == k.size(0), "KVCache: batch size changed from ", k_[layer].size(0), " to ",
                k.size(0), "; clear() the cache first");
    k_[layer] = cat({k_[layer], k}, 2);
    v_[layer] = cat({v_[layer], v}, 2);
  } else {
    k_[layer] = contiguous(k);
    v_[layer] = contiguous(v);
  }
  return {k_[layer], v_[layer]};
}

DecoderConfig resolved(DecoderConfig c) {
  if (c.n_kv_head == 0) c.n_kv_head = c.n_head;
  INGOT_CHECK(c.dim > 0 && c.n_head > 0, "decoder: hidden size and head count must be positive, got ", c.dim,
              " and ", c.n_head);
  if (c.head_dim == 0) {
    INGOT_CHECK(c.dim % c.n_head == 0, "decoder: hidden size (", c.dim, ") must be a multiple of the head count (",
                c.n_head, ")");
    c.head_dim = c.dim / c.n_head;
  }
  INGOT_CHECK(c.n_kv_head > 0 && c.n_head % c.n_kv_head == 0, "decoder: attention heads (", c.n_head,
              ") must be a multiple of key/value heads (", c.n_kv_head, ")");
  INGOT_CHECK(!c.rope || c.head_dim % 2 == 0, "decoder: RoPE needs an even head dim, got ", c.head_dim);
  INGOT_CHECK(c.intermediate > 0, "decoder: intermediate size must be positive, got ", c.intermediate);
  return c;
}

// Attention ------------------------------------------------------------------------------------------------

Attention::Attention(const DecoderConfig& cfg) : cfg_(resolved(cfg)) {
  using nn::LoRALinear;
  const int64_t q_dim = cfg_.n_head * cfg_.head_dim, kv_dim = cfg_.n_kv_head * cfg_.head_dim;
  if (cfg_.fused_qkv) {
    c_attn_ = register_module("c_attn",
                              std::make_shared<LoRALinear>(cfg_.dim, q_dim + 2 * kv_dim, cfg_.qkv_bias, cfg_.init_std));
    out_proj_ = register_module("c_proj", std::make_shared<LoRALinear>(q_dim, cfg_.dim, cfg_.out_bias, cfg_.out_init_std));
  } else {
    q_proj_ = register_module("q_proj", std::make_shared<LoRALinear>(cfg_.dim, q_dim, cfg_.qkv_bias, cfg_.init_std));
    k_proj_ = register_module("k_proj", std::make_shared<LoRALinear>(cfg_.dim, kv_dim, cfg_.qkv_bias, cfg_.init_std));
    v_proj_ = register_module("v_proj", std::make_shared<LoRALinear>(cfg_.dim, kv_dim, cfg_.qkv_bias, cfg_.init_std));
    out_proj_ = register_module("o_proj", std::make_shared<LoRALinear>(q_dim, cfg_.dim, cfg_.out_bias, cfg_.out_init_std));
  }
  if (cfg_.qk_norm) {
    q_norm_ = register_module("q_norm", std::make_shared<nn::RMSNorm>(cfg_.head_dim, cfg_.norm_eps));
    k_norm_ = register_module("k_norm", std::make_shared<nn::RMSNorm>(cfg_.head_dim, cfg_.norm_eps));
  }
  dropout_ = register_module("resid_dropout", std::make_shared<nn::Dropout>(cfg_.dropout));
  // Unscaled rotary frequencies are rope_tables' own (same f32 formula); only scaled ones are passed in.
  if (cfg_.rope && cfg_.rope_scaling.kind != RopeScaling::Kind::None)
    inv_freq_ = rope_inv_freq(cfg_.head_dim, cfg_.rope_theta, cfg_.rope_scaling);
}

std::pair<Tensor, Tensor> Attention::rope_for(int64_t start, int64_t len, Device device) {
  const int64_t end = start + len;
  if (!rope_cos_.defined() || rope_cos_.size(0) < end || !(rope_cos_.device() == device)) {
    // Grow geometrically so token-by-token decoding rebuilds the tables O(log n) times.
    int64_t n = std::max<int64_t>(end, rope_cos_.defined() ? 2 * rope_cos_.size(0) : 0);
    std::tie(rope_cos_, rope_sin_) = rope_tables(n, cfg_.head_dim, cfg_.rope_theta, device, 0, inv_freq_);
  }
  if (start == 0 && len == rope_cos_.size(0)) return {rope_cos_, rope_sin_};
  return {narrow(rope_cos_, 0, start, len), narrow(rope_sin_, 0, start, len)};
}

namespace {

// INGOT_LORA_ROUNDED_SUMS=1: a LoRA projection's base + delta rounded to its dtype first, as before Notes [Rope of a
// sum] and [Residual of a sum] (the A/B of bench/RESULTS.md 2026-11-27, twenty-fifth session).
bool rounded_sums() {
  static const bool on = [] {
    const char* v = std::getenv("INGOT_LORA_ROUNDED_SUMS");
    return v && std::string(v) == "1";
  }();
  return on;
}

// Dropout of a projection's two summands: one mask for both, so they are summed first when it drops anything.
nn::LoRAParts dropped(nn::Dropout& d, const nn::LoRAParts& p) {
  if (!p.delta.defined()) return {d.forward(p.base), Tensor()};
  if (d.is_training() && d.p() > 0) return {d.forward(p.sum()), Tensor()};
  return p;
}

}  // namespace

Tensor Attention::forward(const Tensor& x, KVCache* cache, size_t layer, const Tensor& positions) {
  return forward_parts(x, cache, layer, positions).sum();
}

nn::LoRAParts Attention::forward_parts(const Tensor& x, KVCache* cache, size_t layer, const Tensor& positions) {
  INGOT_CHECK(x.dim() == 3 && x.size(2) == cfg_.dim, "attention: expected x [B, T, ", cfg_.dim, "], got ",
              shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), D = cfg_.head_dim;
  const int64_t q_dim = cfg_.n_head * D, kv_dim = cfg_.n_kv_head * D;
  const int64_t start = cache ? cache->length() : 0;
  INGOT_CHECK(cfg_.sliding_window == 0 || start + T <= cfg_.sliding_window, "attention: ", start + T,
              " tokens exceed the sliding window of ", cfg_.sliding_window,
              " (sliding-window attention is not implemented; shorten the sequence)");
  if (positions.defined())
    INGOT_CHECK(!cache && positions.shape() == Shape({B, T}) && is_integral(positions.dtype()),
                "attention: expected positions [", B, ", ", T, "] of an integer type and no KV cache, got ",
                dtype_name(positions.dtype()), shape_str(positions.shape()), cache ? " with a cache" : "");
  // Each projection's base and adapter update apart (delta undefined without an adapter).
  nn::LoRAParts q, k, v;
  if (c_attn_) {
    std::vector<Tensor> parts = split_sizes(c_attn_->forward(x), {q_dim, kv_dim, kv_dim}, -1);
    q.base = parts[0], k.base = parts[1], v.base = parts[2];
  } else {
    // Note [Adapters of one input] (autograd/nn/lora.h): q, k and v adapters share their A-products.
    const std::vector<nn::LoRAParts> qkv =
        nn::LoRALinear::forward_shared_input_parts({q_proj_.get(), k_proj_.get(), v_proj_.get()}, x);
    q = qkv[0], k = qkv[1], v = qkv[2];
    if (rounded_sums()) q = {q.sum(), Tensor()}, k = {k.sum(), Tensor()};
  }
  // [B, T, H*D] -> [B, H, T, D]
  auto heads = [&](const Tensor& t, int64_t h) {
    return t.defined() ? transpose(reshape(t, {B, T, h, D}), 1, 2) : Tensor();
  };
  Tensor qh, kh, vh = heads(v.sum(), cfg_.n_kv_head);
  if (cfg_.qk_norm) {
    // Qwen3 normalizes each head of the projection's output (base and adapter update summed, as peft's forward
    // does), so an update can no longer be added inside the rotation (Note [Rope of a sum]).
    auto normed = [&](nn::RMSNorm& norm, const nn::LoRAParts& p, int64_t h) -> nn::LoRAParts {
      return {reshape(norm.forward(reshape(p.sum(), {B, T, h, D})), {B, T, h * D}), Tensor()};
    };
    q = normed(*q_norm_, q, cfg_.n_head);
    k = normed(*k_norm_, k, cfg_.n_kv_head);
  }
  if (cfg_.rope) {
    auto [cos_t, sin_t] = rope_for(start, T, x.device());
    if (positions.defined()) {
      // Each row's own angles: the table rows at its tokens' positions (all < T), [B, T, D/2].
      cos_t = embedding(cos_t, positions);
      sin_t = embedding(sin_t, positions);
    }
    // Note [Rope of a sum] (autograd/ops/attention.cpp): an adapter's update is added inside the rotation.
    qh = rotary_embedding(heads(q.base, cfg_.n_head), cos_t, sin_t, heads(q.delta, cfg_.n_head));
    kh = rotary_embedding(heads(k.base, cfg_.n_kv_head), cos_t, sin_t, heads(k.delta, cfg_.n_kv_head));
  } else {
    qh = heads(q.sum(), cfg_.n_head);
    kh = heads(k.sum(), cfg_.n_kv_head);
  }
  if (cache) std::tie(kh, vh) = cache->append(layer, kh, vh);
  // Causal with more keys than queries aligns the queries with the last keys (query i sees keys <= start + i).
  Tensor y = scaled_dot_product_attention(qh, kh, vh, /*causal=*/true, std::nullopt, positions);
  y = reshape(transpose(y, 1, 2), {B, T, q_dim});
  return dropped(*dropout_, out_proj_->forward_parts(y));
}

// MLP and block --------------------------------------------------------------------------------------------

DecoderMLP::DecoderMLP(const DecoderConfig& c) {
  using nn::LoRALinear;
  if (c.style == DecoderConfig::Style::GPT2) {
    c_fc_ = register_module("c_fc", std::make_shared<LoRALinear>(c.dim, c.intermediate, true, c.init_std));
    c_proj_ = register_module("c_proj", std::make_shared<LoRALinear>(c.intermediate, c.dim, true, c.out_init_std));
    dropout_ = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
  } else {
    gate_proj_ = register_module("gate_proj", std::make_shared<LoRALinear>(c.dim, c.intermediate, c.mlp_bias, c.init_std));
    up_proj_ = register_module("up_proj", std::make_shared<LoRALinear>(c.dim, c.intermediate, c.mlp_bias, c.init_std));
    down_proj_ = register_module("down_proj",
                                 std::make_shared<LoRALinear>(c.intermediate, c.dim, c.mlp_bias, c.out_init_std));
  }
}

// Note [SwiGLU eager and traced]: a step computes silu(a) * b as one silu_mul (one kernel, and its backward keeps a
// and b but not silu(a)), eagerly and traced alike. A traced step once recorded silu and mul instead, so its compiled
// graph kept what the pair keeps; but the traced step itself runs eagerly, and the pair's saved silu(a) made it the
// run's peak (35.46 GB for the 8B LoRA at 2 x 2048 against 30.73 GB for the compiled steps after it). silu_mul and
// silu_mul_bwd lower to the same kernel expressions (autograd/ops/pointwise.cpp), and remat may recompute
// silu_mul's output (pointwise, cheap) as it did the pair's.
namespace {
Tensor swiglu(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return mul(silu(a), b);
  return silu_mul(a, b);
}

// Note [SwiGLU of sums] (autograd/ops/pointwise.cpp): whether a projection's update is added inside the activation,
// in f32: an adapted bf16 / f16 projection (f32 / f64 sums are exact enough as they are). A delta always has its
// base's dtype (LoRALinear::forward_parts).
bool adds_inside_activation(const nn::LoRAParts& p) {
  const DType dt = p.base.dtype();
  return p.delta.defined() && (dt == DType::bf16 || dt == DType::f16) && !rounded_sums();
}
}  // namespace

Tensor DecoderMLP::forward(const Tensor& x) { return forward_parts(x).sum(); }

// Note [MLP checkpointing]: `train.activation_checkpointing: mlp` checkpoints the MLP's widening half with the norm
// before it: norm2, the up-projections and the activation, a region of each block (autograd/checkpoint.h). The
// backward keeps the region's input h, [tokens, dim] (the residual stream), instead of what the norm's and the
// activation's backwards read: h, two [tokens, intermediate] values for a SwiGLU (268 MB per block of the 8B at
// 2 x 2048 in bf16, against 34 MB), and norm2(h) too where the up-projections train; it runs the norm and the
// up-projections again. The last projection
// stays outside the region: a frozen one (LoRA, QLoRA) keeps nothing, a trained one keeps the activation's output as
// before. Per block it costs the up-projections' forward once more (about a third of what `blocks` recomputes, which
// includes the attention and the down projection) for most of the block's activation memory.
// train.activation_checkpointing_layers checkpoints the first N blocks only (set_checkpointing): each block left out
// keeps 0.20-0.24 GB more (the 8B, QLoRA at 2 x 2048) and saves 1.3-1.9 ms of products (H200: bench/RESULTS.md,
// twenty-ninth session).
Tensor DecoderMLP::widen(const Tensor& x) {
  if (c_fc_) {
    const nn::LoRAParts p = c_fc_->forward_parts(x);
    if (adds_inside_activation(p)) return gelu_tanh_sum(p.base, p.delta);
    return gelu(p.sum(), /*approximate_tanh=*/true);
  }
  // Note [Adapters of one input] (autograd/nn/lora.h): gate's and up's adapters share their A-product. Gate and up
  // read one input in one compute dtype, so their outputs share shape and dtype.
  const std::vector<nn::LoRAParts> gu = nn::LoRALinear::forward_shared_input_parts({gate_proj_.get(), up_proj_.get()}, x);
  const nn::LoRAParts &g = gu[0], &u = gu[1];
  if (adds_inside_activation(g) && adds_inside_activation(u)) return silu_mul_sums(g.base, g.delta, u.base, u.delta);
  return swiglu(g.sum(), u.sum());
}

nn::LoRAParts DecoderMLP::narrow(const Tensor& h) {
  if (c_fc_) return dropped(*dropout_, c_proj_->forward_parts(h));
  return down_proj_->forward_parts(h);
}

nn::LoRAParts DecoderMLP::forward_parts(const Tensor& x) { return narrow(widen(x)); }

DecoderBlock::DecoderBlock(const DecoderConfig& cfg) {
  const DecoderConfig c = resolved(cfg);
  if (c.style == DecoderConfig::Style::GPT2) {
    ln1_ = register_module("ln_1", std::make_shared<nn::LayerNorm>(c.dim, c.norm_eps));
    attn_ = register_module("attn", std::make_shared<Attention>(c));
    ln2_ = register_module("ln_2", std::make_shared<nn::LayerNorm>(c.dim, c.norm_eps));
  } else {
    rms1_ = register_module("input_layernorm", std::make_shared<nn::RMSNorm>(c.dim, c.norm_eps));
    attn_ = register_module("self_attn", std::make_shared<Attention>(c));
    rms2_ = register_module("post_attention_layernorm", std::make_shared<nn::RMSNorm>(c.dim, c.norm_eps));
  }
  mlp_ = register_module("mlp", std::make_shared<DecoderMLP>(c));
}

Tensor DecoderBlock::norm(int which, const Tensor& x) {
  if (ln1_) return (which == 1 ? ln1_ : ln2_)->forward(x);
  return (which == 1 ? rms1_ : rms2_)->forward(x);
}

namespace {

// Note [Residual of a sum]
// The residual stream plus a LoRA projection's output, x + (base + delta), with one rounding. As with q and k (Note
// [Rope of a sum], autograd/ops/attention.cpp), a bf16 base + delta rounded first is the base itself while the
// adapter's update is below half its ulp, so o_proj's (and down_proj's) early updates would change nothing. Summed in
// f32 with the residual and rounded once, they move the outputs the way an f32 sum does (x + base, two bf16 values,
// often lies halfway between two bf16 values, and the update decides the side), as torch.compile's fused kernel
// rounds them (tests/models/test_lora.cpp). A compiled step fuses these casts and adds into the kernel of the
// residual add and the next norm, as it did with the rounded sum (which is why compiled runs kept o_proj's update and
// eager ones did not: bench/RESULTS.md 2026-11-27, twenty-fifth session), with delta written in f32 by its product;
// an eager one pays two more elementwise passes per LoRA projection. (gate_proj's and up_proj's updates are added
// inside the SwiGLU instead: Note [SwiGLU of sums], autograd/ops/pointwise.cpp.)
Tensor residual_add(const Tensor& x, const nn::LoRAParts& p) {
  if (!p.delta.defined() || rounded_sums()) return add(x, p.sum());
  if (x.dtype() == DType::f32 || x.dtype() == DType::f64) return add(add(x, p.base), p.delta);
  // The f32 operand is delta widened (a compiled step's product writes it in f32: matmul_epilogue), not x: a cast
  // of the block's input alone would be a node a checkpointed backward could run early, for every block at once.
  return cast(add(x, add(p.base, cast(p.delta, DType::f32))), x.dtype());
}

}  // namespace

Tensor DecoderBlock::body(const Tensor& x, KVCache* cache, size_t layer, const Tensor& positions) {
  Tensor h = residual_add(x, attn_->forward_parts(norm(1, x), cache, layer, positions));
  auto widen = [this](const Tensor& in) { return mlp_->widen(norm(2, in)); };
  // Note [MLP checkpointing].
  const Tensor a = checkpointing_ != Checkpointing::mlp || cache
                       ? widen(h)
                       : checkpoint([widen](const std::vector<Tensor>& in) { return std::vector<Tensor>{widen(in[0])}; },
                                    {h})[0];
  return residual_add(h, mlp_->narrow(a));
}

Tensor DecoderBlock::forward(const Tensor& x, KVCache* cache, size_t layer, const Tensor& positions) {
  // Inside the hooks: a sharded unit's weights are gathered around the forward, and again for its backward
  // (distributed/fsdp.h), which is when the region is recomputed.
  return with_forward_hooks([&] {
    if (checkpointing_ != Checkpointing::blocks || cache) return body(x, cache, layer, positions);
    return checkpoint([this, layer, positions](const std::vector<Tensor>& in) {
             return std::vector<Tensor>{body(in[0], nullptr, layer, positions)};
           },
                      {x})[0];
  });
}

int64_t set_checkpointing(nn::Module& model, Checkpointing mode, int64_t count) {
  INGOT_CHECK(count >= 0, "set_checkpointing: count must be >= 0 (0: every block), got ", count);
  int64_t set = 0;
  for (auto& [name, m] : model.named_modules())
    if (auto* block = dynamic_cast<DecoderBlock*>(m.get())) {
      const bool on = mode != Checkpointing::none && (count == 0 || set < count);
      block->set_checkpointing(on ? mode : Checkpointing::none);
      set += on ? 1 : 0;
    }
  return set;
}

}  // namespace ingot::models
