// CausalLM: what recipes need from any decoder-only language model, so a training loop can hold a GPT2 or
// a Llama through one pointer.
#pragma once

#include "autograd/nn/module.h"

namespace ingot::models {

class CausalLM : public nn::Module {
 public:
  // ids [B, T] (i64) -> logits [B, T, vocab]
  virtual Tensor forward(const Tensor& ids) = 0;
  // Mean cross entropy of forward(ids) against targets [B, T] (i64; -100 is ignored): an f32 scalar
  // (f64 for an f64 model).
  virtual Tensor loss(const Tensor& ids, const Tensor& targets);
  virtual int64_t vocab_size() const = 0;
};

// Mean cross entropy of logits [B, T, V] against targets [B, T] (f32 for 16-bit logits).
Tensor lm_loss(const Tensor& logits, const Tensor& targets);

}  // namespace ingot::models
