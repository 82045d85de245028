// Autoregressive generation with a KV cache: greedy decoding or sampling with temperature, top-k and top-p
// (applied in that order, as transformers' logits warpers), seeded so a run is reproducible.
#pragma once

#include <cstdint>
#include <vector>

#include "models/causal_lm.h"

namespace ingot::models {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  bool do_sample = false;    // false: greedy (the first maximal logit, as torch.argmax)
  double temperature = 1.0;  // > 0; only when sampling
  int64_t top_k = 0;         // 0: off; keeps the k largest logits (ties with the k-th kept too)
  double top_p = 1.0;        // 1: off; keeps the smallest set of top tokens whose probability reaches top_p
  uint64_t seed = 0;         // sampling draws Philox uniforms keyed by (seed, draw number)
  std::vector<int64_t> eos_token_ids;  // a row stops after producing one of these
  int64_t pad_token_id = 0;            // appended to rows that stopped while others continue
  bool use_cache = true;               // false recomputes the whole sequence every step (for checking)
};

// prompt [B, T] (integer ids) -> [B, T + n] i64 with n <= max_new_tokens new tokens per row; generation ends
// early once every row has produced an EOS token. Runs without gradients in eval mode (restored after).
Tensor generate(CausalLM& model, const Tensor& prompt, const GenerateOptions& opts);

// The token chosen from one row of next-token logits; `draw` numbers the uniform used when sampling.
int64_t choose_token(const std::vector<float>& logits, const GenerateOptions& opts, uint64_t draw);

}  // namespace ingot::models
