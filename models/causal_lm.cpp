#include "models/causal_lm.h"

#include "autograd/nn/lora.h"

namespace ingot::models {

Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  INGOT_CHECK(logits.dim() == 3, "lm_loss: expected logits [B, T, V], got ", shape_str(logits.shape()));
  INGOT_CHECK(targets.shape() == Shape({logits.size(0), logits.size(1)}), "lm_loss: expected targets [",
              logits.size(0), ", ", logits.size(1), "], got ", shape_str(targets.shape()));
  // cross_entropy computes in f32 (f64 for f64 logits) and returns an f32 loss for 16-bit logits, so no
  // f32 copy of the logits is made here.
  return cross_entropy(reshape(logits, {-1, logits.size(2)}), reshape(targets, {-1}));
}

Tensor lm_loss(const Tensor& hidden, const Tensor& head, const Tensor& targets, int64_t chunks) {
  INGOT_CHECK(hidden.dim() == 3, "lm_loss: expected hidden states [B, T, H], got ", shape_str(hidden.shape()));
  INGOT_CHECK(targets.shape() == Shape({hidden.size(0), hidden.size(1)}), "lm_loss: expected targets [",
              hidden.size(0), ", ", hidden.size(1), "], got ", shape_str(targets.shape()));
  INGOT_CHECK(chunks >= 0, "lm_loss: chunks must be >= 0, got ", chunks);
  const int64_t rows = hidden.size(0) * hidden.size(1);
  const int64_t chunk_rows = chunks == 0 ? 0 : std::max<int64_t>(1, (rows + chunks - 1) / chunks);
  return linear_cross_entropy(reshape(hidden, {-1, hidden.size(2)}), head, reshape(targets, {-1}), -100, 0.0,
                              Reduction::Mean, chunk_rows);
}

namespace {
// A head of weight `w` (and `bias`, may be undefined) that may go through lm_loss(hidden, head, targets): no bias,
// and no gradient for w in this forward unless `trained` (set_trained_head_in_chunks).
bool head_in_chunks(const Tensor& w, const Tensor& bias, bool trained) {
  return w.defined() && !bias.defined() && (trained || !(grad_enabled() && w.requires_grad()));
}
}  // namespace

// An adapted, quantized or biased lm_head, or a trained one, goes through the logits.
Tensor CausalLM::loss(const Tensor& ids, const Tensor& targets, const Tensor& positions) {
  nn::LoRALinear* head = untied_head();
  const bool plain = head ? !head->has_lora() && !head->frozen_base() &&
                                head_in_chunks(head->weight(), head->bias(), trained_head_in_chunks_)
                          : head_in_chunks(tied_head_weight(), Tensor(), trained_head_in_chunks_);
  if (!plain) return lm_loss(forward(ids, positions), targets);
  return with_forward_hooks([&] {
    const Tensor h = hidden_states(ids, positions);
    // The weight is read inside the hooks: a sharded model gathers it there.
    const Tensor w = head ? head->weight() : tied_head_weight();
    const auto c = compute_dtype();
    return lm_loss(nn::maybe_cast(h, c), nn::maybe_cast(w, c), targets, loss_chunks_);
  });
}

void CausalLM::set_loss_chunks(int64_t chunks) {
  INGOT_CHECK(chunks >= 0, "set_loss_chunks: chunks must be >= 0 (0: chunks of at most 256 MiB of logits), got ", chunks);
  loss_chunks_ = chunks;
}

Tensor CausalLM::hidden_states(const Tensor&, const Tensor&) {
  INGOT_CHECK(false, "this model does not give its hidden states");
  return Tensor();
}

Tensor CausalLM::forward_cached(const Tensor&, KVCache&) {
  INGOT_CHECK(false, "this model does not support a KV cache");
  return Tensor();
}

Tensor shifted_targets(const Tensor& ids) {
  INGOT_CHECK(ids.dim() == 2 && is_integral(ids.dtype()), "shifted_targets: expected ids [B, T] of an integer type, got ",
              dtype_name(ids.dtype()), shape_str(ids.shape()));
  Tensor ids64 = ids.device() == Device::cpu() ? ids.to(DType::i64) : ids.to(Device::cpu()).to(DType::i64);
  Tensor t = full(ids.shape(), -100.0, DType::i64);
  const int64_t B = ids.size(0), T = ids.size(1);
  std::vector<double> v = ids64.to_vector();
  int64_t* out = t.data<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i + 1 < T; ++i) out[b * T + i] = static_cast<int64_t>(v[b * T + i + 1]);
  return t.to(ids.device());
}

}  // namespace ingot::models
