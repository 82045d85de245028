#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "models/decoder.h"
#include "runtime/rng.h"

namespace ingot::models {
namespace {

void check_options(const GenerateOptions& o, int64_t vocab) {
  INGOT_CHECK(o.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ", o.max_new_tokens);
  INGOT_CHECK(o.top_k >= 0, "generate: top_k must be >= 0, got ", o.top_k);
  INGOT_CHECK(o.top_p > 0 && o.top_p <= 1, "generate: top_p must be in (0, 1], got ", o.top_p);
  INGOT_CHECK(!o.do_sample || o.temperature > 0, "generate: temperature must be > 0 when sampling, got ",
              o.temperature);
  for (int64_t e : o.eos_token_ids)
    INGOT_CHECK(e >= 0 && e < vocab, "generate: eos token id ", e, " is outside the vocabulary [0, ", vocab, ")");
  INGOT_CHECK(o.pad_token_id >= 0 && o.pad_token_id < vocab, "generate: pad_token_id ", o.pad_token_id,
              " is outside the vocabulary [0, ", vocab, ")");
}

// Restores the model's training mode when generation ends (or throws).
class EvalScope {
 public:
  explicit EvalScope(nn::Module& m) : m_(m), was_training_(m.is_training()) { m_.eval(); }
  ~EvalScope() { m_.train(was_training_); }

 private:
  nn::Module& m_;
  bool was_training_;
};

}  // namespace

int64_t choose_token(const std::vector<float>& logits, const GenerateOptions& o, uint64_t draw) {
  INGOT_CHECK(!logits.empty(), "generate: empty logits");
  if (!o.do_sample) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  const int64_t V = static_cast<int64_t>(logits.size());
  std::vector<double> s(logits.begin(), logits.end());
  for (double& x : s) x /= o.temperature;
  std::vector<int64_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  // Descending by logit; stable so equal logits keep id order.
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
  int64_t keep = V;
  if (o.top_k > 0 && o.top_k < V) {
    const double kth = s[order[o.top_k - 1]];
    keep = o.top_k;
    while (keep < V && s[order[keep]] >= kth) ++keep;
  }
  const double mx = s[order[0]];
  std::vector<double> p(static_cast<size_t>(keep));
  double z = 0;
  for (int64_t i = 0; i < keep; ++i) z += (p[i] = std::exp(s[order[i]] - mx));
  for (double& x : p) x /= z;
  if (o.top_p < 1.0) {
    double cum = 0;
    int64_t n = 0;
    while (n < keep && cum < o.top_p) cum += p[n++];
    keep = std::max<int64_t>(n, 1);
    z = 0;
    for (int64_t i = 0; i < keep; ++i) z += p[i];
    for (int64_t i = 0; i < keep; ++i) p[i] /= z;
  }
  const double u = philox_uniform(o.seed, draw);
  double cum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += p[i];
    if (u < cum) return order[i];
  }
  return order[keep - 1];
}

Tensor generate(CausalLM& model, const Tensor& prompt, const GenerateOptions& o) {
  INGOT_CHECK(prompt.dim() == 2 && is_integral(prompt.dtype()) && prompt.size(1) > 0,
              "generate: expected prompt ids [B, T] (T >= 1) of an integer type, got ", dtype_name(prompt.dtype()),
              shape_str(prompt.shape()));
  const int64_t V = model.vocab_size(), B = prompt.size(0), T = prompt.size(1);
  check_options(o, V);
  const int64_t max_pos = model.max_positions();
  INGOT_CHECK(max_pos == 0 || T + o.max_new_tokens <= max_pos, "generate: prompt length ", T, " + max_new_tokens ",
              o.max_new_tokens, " exceeds the model's ", max_pos, " positions");
  NoGradGuard ng;
  EvalScope eval(model);
  const Device dev = prompt.device();
  std::vector<double> host = prompt.to_vector();
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) rows[b].push_back(static_cast<int64_t>(host[b * T + t]));
  std::vector<bool> done(static_cast<size_t>(B), false);
  auto is_eos = [&](int64_t id) {
    return std::find(o.eos_token_ids.begin(), o.eos_token_ids.end(), id) != o.eos_token_ids.end();
  };
  auto as_tensor = [&](int64_t from) {
    std::vector<int64_t> flat;
    for (auto& r : rows) flat.insert(flat.end(), r.begin() + from, r.end());
    return from_vector_i64(flat, {B, static_cast<int64_t>(rows[0].size()) - from}, dev);
  };

  KVCache cache;
  Tensor input = prompt.to(DType::i64);
  uint64_t draw = 0;
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    Tensor logits = o.use_cache ? model.forward_cached(input, cache) : model.forward(as_tensor(0));
    Tensor last = select(logits, 1, logits.size(1) - 1);  // [B, V]
    std::vector<double> lv = last.to_vector();
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      int64_t next = o.pad_token_id;
      if (!done[b]) {
        std::vector<float> row(lv.begin() + b * V, lv.begin() + (b + 1) * V);
        next = choose_token(row, o, draw++);
        if (is_eos(next)) done[b] = true;
      }
      rows[b].push_back(next);
      all_done = all_done && done[b];
    }
    if (all_done) break;
    input = as_tensor(static_cast<int64_t>(rows[0].size()) - 1);
  }
  return as_tensor(0);
}

}  // namespace ingot::models
