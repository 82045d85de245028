// CausalLM: what recipes need from any decoder-only language model, so a training loop can hold a GPT2 or
// a Llama through one pointer.
#pragma once

#include "autograd/nn/module.h"

namespace ingot::nn {
class LoRALinear;  // autograd/nn/lora.h
}  // namespace ingot::nn

namespace ingot::models {

class KVCache;  // models/decoder.h

class CausalLM : public nn::Module {
 public:
  // ids [B, T] (i64) -> logits [B, T, vocab]
  Tensor forward(const Tensor& ids) { return forward(ids, Tensor()); }
  // Packed rows: positions [B, T] (integer) is each token's position within its document, 0 where a document
  // starts; positions restart there (RoPE, learned positions) and attention stays inside each document, so a
  // document's logits equal those of the document alone. Undefined: positions 0..T-1, one document per row.
  virtual Tensor forward(const Tensor& ids, const Tensor& positions) = 0;
  // Incremental decoding: ids [B, T] continue the cache's tokens (positions cache.length()...); returns their
  // logits [B, T, vocab] and appends their keys and values. The default refuses (a model without a cache).
  virtual Tensor forward_cached(const Tensor& ids, KVCache& cache);
  // Mean cross entropy of forward(ids, positions) against targets [B, T] (i64; -100 is ignored): an f32 scalar
  // (f64 for an f64 model). When the head is a linear without bias, adapter or quantized base whose weight gets no
  // gradient (a LoRA or QLoRA fine-tune's frozen lm_head or tied embedding, or no grad mode), it is computed from
  // hidden_states() without ever holding all the logits (lm_loss of the hidden states and the head's weight below).
  Tensor loss(const Tensor& ids, const Tensor& targets, const Tensor& positions = Tensor());
  virtual int64_t vocab_size() const = 0;
  // Longest sequence the position embedding covers (0: unknown).
  virtual int64_t max_positions() const { return 0; }
  // How many chunks loss() splits the rows into when it skips the logits (train.loss_chunks); 0: as many as keep each
  // chunk's logits under 256 MiB (linear_cross_entropy's default).
  void set_loss_chunks(int64_t chunks);
  // Whether a head that gets a gradient makes its logits in chunks too, its gradient made with them (Note [Logits in
  // chunks]); off: through the whole logits.
  void set_trained_head_in_chunks(bool on) { trained_head_in_chunks_ = on; }

 protected:
  // What loss() needs to skip the logits; the defaults make it go through forward(). The trunk's output [B, T, H]
  // (what the head reads), run inside the model's forward hooks by loss(); the untied lm_head, or null; the tied
  // head's weight (the token embedding's) when there is no lm_head.
  virtual Tensor hidden_states(const Tensor& ids, const Tensor& positions);
  virtual nn::LoRALinear* untied_head() { return nullptr; }
  virtual Tensor tied_head_weight() const { return Tensor(); }

 private:
  int64_t loss_chunks_ = 0;
  bool trained_head_in_chunks_ = false;
};

// Mean cross entropy of logits [B, T, V] against targets [B, T] (f32 for 16-bit logits).
Tensor lm_loss(const Tensor& logits, const Tensor& targets);
// The same of the logits hidden [B, T, H] x head^T (head [V, H], no gradient), made a chunk of rows at a time and
// never whole (linear_cross_entropy, Note [Logits in chunks] in autograd/ops/loss.cpp): `chunks` chunks of the
// B x T rows, or 0 for linear_cross_entropy's default.
Tensor lm_loss(const Tensor& hidden, const Tensor& head, const Tensor& targets, int64_t chunks = 0);

// Next-token targets for ids [B, T]: ids shifted left by one with -100 in the last column, so
// lm_loss(forward(ids), shifted_targets(ids)) is Hugging Face's causal-LM loss with labels = ids.
Tensor shifted_targets(const Tensor& ids);

}  // namespace ingot::models
