// Tiny model configurations shared by the model tests (n_layer 2, width 32, 4 heads, vocab 64).
#pragma once

#include "models/gpt2.h"
#include "models/llama.h"
#include "optim/optimizer.h"

namespace ingot::testing {

inline models::GPT2Config tiny_gpt2_config() {
  models::GPT2Config c;
  c.vocab_size = 64;
  c.n_positions = 16;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 4;
  return c;
}

inline models::LlamaConfig tiny_llama_config() {
  models::LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 16;
  return c;
}

// A fixed repeating token sequence [B, T+1] split into inputs and next-token targets.
inline std::pair<Tensor, Tensor> repeating_batch(int64_t B, int64_t T, int64_t period = 5) {
  std::vector<int64_t> ids, tgt;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      ids.push_back((3 * b + t) % period * 7 % 64);
      tgt.push_back((3 * b + t + 1) % period * 7 % 64);
    }
  return {from_vector_i64(ids, {B, T}), from_vector_i64(tgt, {B, T})};
}

// The losses of the first and the last of `steps` AdamW steps (lr 1e-2, no weight decay) on repeating_batch(2, 12):
// whether a model learns a sequence it sees again and again.
inline std::pair<double, double> first_and_last_adamw_losses(models::CausalLM& model, int steps = 30) {
  auto [ids, tgt] = repeating_batch(2, 12);
  optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    Tensor loss = model.loss(ids, tgt);
    if (step == 0) first = loss.item();
    last = loss.item();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  return {first, last};
}

}  // namespace ingot::testing
