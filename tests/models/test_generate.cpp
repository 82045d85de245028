#include <gtest/gtest.h>

#include <map>

#include "models/generate.h"
#include "models/hf_checkpoint.h"
#include "runtime/rng.h"
#include "runtime/safetensors.h"
#include "tiny_models.h"

namespace ingot {
namespace {

using models::GenerateOptions;
using models::KVCache;

std::string fixture(const std::string& name) { return std::string(INGOT_SOURCE_DIR) + "/tests/fixtures/hf/" + name; }

TEST(Generate, KVCachedLogitsEqualAFullRecomputeForEveryFixture) {
  for (const char* name : {"gpt2_tiny", "llama3_tiny", "qwen2_tiny", "qwen3_tiny"}) {
    SCOPED_TRACE(name);
    models::HFModel m = models::load_hf_model(fixture(name));
    Tensor ids = SafetensorsFile::open(fixture(name) + "/reference.safetensors").get("input_ids");
    NoGradGuard ng;
    Tensor full = m.model->forward(ids);  // [2, 16, V]
    // Prefill 5 tokens, then 1, then 3, then the remaining 7: each chunk's logits match the full pass.
    KVCache cache;
    int64_t pos = 0;
    for (int64_t len : {5, 1, 3, 7}) {
      Tensor part = m.model->forward_cached(narrow(ids, 1, pos, len), cache);
      EXPECT_LE(max_rel_error(part, narrow(full, 1, pos, len), 1e-5, 1e-5), 1.0) << "chunk at " << pos;
      pos += len;
      EXPECT_EQ(cache.length(), pos);
    }
  }
}

TEST(Generate, CachedAndUncachedGreedyDecodingAgree) {
  manual_seed(21);
  models::Llama model(testing::tiny_llama_config());
  auto [ids, tgt] = testing::repeating_batch(2, 4);
  GenerateOptions o;
  o.max_new_tokens = 8;
  Tensor cached = models::generate(model, ids, o);
  o.use_cache = false;
  Tensor full = models::generate(model, ids, o);
  EXPECT_EQ(cached.shape(), (Shape{2, 12}));
  EXPECT_EQ(cached.to_vector(), full.to_vector());
  EXPECT_TRUE(model.is_training());  // generation restores the mode it found
}

TEST(Generate, SamplingIsSeededAndTopKAndTopPRestrictTheChoices) {
  std::vector<float> logits = {2.0f, 1.0f, 0.5f, 3.0f, -1.0f, 0.0f};
  GenerateOptions o;
  EXPECT_EQ(models::choose_token(logits, o, 0), 3);  // greedy
  o.do_sample = true;
  std::map<int64_t, int> counts;
  for (uint64_t d = 0; d < 4000; ++d) counts[models::choose_token(logits, o, d)]++;
  EXPECT_EQ(counts.size(), 6u);  // every token possible at temperature 1
  // p(3) = e^3 / sum e^x ~ 0.61
  EXPECT_NEAR(counts[3] / 4000.0, 0.6103, 0.03);
  o.top_k = 2;
  counts.clear();
  for (uint64_t d = 0; d < 1000; ++d) counts[models::choose_token(logits, o, d)]++;
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_TRUE(counts.count(3) && counts.count(0));
  o.top_k = 0;
  o.top_p = 0.8;  // sorted probabilities 0.61, 0.22, 0.08...: the top two reach 0.8
  counts.clear();
  for (uint64_t d = 0; d < 1000; ++d) counts[models::choose_token(logits, o, d)]++;
  EXPECT_EQ(counts.size(), 2u);
  o.top_p = 1.0;
  o.temperature = 0.05;  // nearly greedy
  for (uint64_t d = 0; d < 100; ++d) EXPECT_EQ(models::choose_token(logits, o, d), 3);
  // The same seed gives the same draws; another seed differs somewhere.
  o.temperature = 1.0;
  std::vector<int64_t> a, b, c;
  for (uint64_t d = 0; d < 50; ++d) {
    a.push_back(models::choose_token(logits, o, d));
    b.push_back(models::choose_token(logits, o, d));
  }
  o.seed = 99;
  for (uint64_t d = 0; d < 50; ++d) c.push_back(models::choose_token(logits, o, d));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Generate, SampledGenerationIsReproducibleForASeed) {
  models::HFModel m = models::load_hf_model(fixture("llama_tiny"));
  Tensor prompt = from_vector_i64({5, 17, 42, 99}, {1, 4});
  GenerateOptions o;
  o.do_sample = true;
  o.temperature = 0.9;
  o.top_k = 50;
  o.top_p = 0.95;
  o.max_new_tokens = 10;
  o.seed = 7;
  Tensor a = models::generate(*m.model, prompt, o), b = models::generate(*m.model, prompt, o);
  EXPECT_EQ(a.to_vector(), b.to_vector());
  o.seed = 8;
  EXPECT_NE(models::generate(*m.model, prompt, o).to_vector(), a.to_vector());
}

TEST(Generate, StopsAtEosAndPadsRowsThatFinishedEarly) {
  models::HFModel m = models::load_hf_model(fixture("llama_tiny"));
  SafetensorsFile ref = SafetensorsFile::open(fixture("llama_tiny") + "/reference.safetensors");
  std::vector<double> greedy = ref.get("generate_ids").to_vector();  // 8 prompt + 12 new
  GenerateOptions o;
  o.max_new_tokens = 12;
  o.eos_token_ids = {static_cast<int64_t>(greedy[11])};  // the 4th new token
  Tensor prompt = narrow(narrow(ref.get("input_ids"), 0, 0, 1), 1, 0, 8);
  Tensor out = models::generate(*m.model, prompt, o);
  const int64_t first = std::find(greedy.begin() + 8, greedy.end(), greedy[11]) - greedy.begin();
  EXPECT_EQ(out.size(1), first + 1);  // ends with the first EOS
  EXPECT_EQ(out.item_at(out.size(1) - 1), greedy[11]);
  o.max_new_tokens = 0;
  EXPECT_EQ(models::generate(*m.model, prompt, o).size(1), 8);

  // Two rows: one row's EOS pads it while the other continues.
  Tensor two = narrow(ref.get("input_ids"), 1, 0, 8);
  o.max_new_tokens = 12;
  o.pad_token_id = 0;
  Tensor both = models::generate(*m.model, two, o);
  const std::vector<double> all = both.to_vector();
  std::vector<double> row0(all.begin(), all.begin() + both.size(1));
  for (int64_t t = first + 1; t < both.size(1); ++t) EXPECT_EQ(row0[t], 0.0) << t;
}

TEST(Generate, BadArgumentsAreErrors) {
  models::HFModel m = models::load_hf_model(fixture("gpt2_tiny"));
  Tensor prompt = from_vector_i64({1, 2, 3}, {1, 3});
  GenerateOptions o;
  o.max_new_tokens = 62;  // 3 + 62 > 64 positions
  EXPECT_THROW(models::generate(*m.model, prompt, o), Error);
  o = {};
  o.do_sample = true;
  o.temperature = 0;
  EXPECT_THROW(models::generate(*m.model, prompt, o), Error);
  o = {};
  o.top_p = 0;
  EXPECT_THROW(models::generate(*m.model, prompt, o), Error);
  o = {};
  o.eos_token_ids = {512};
  EXPECT_THROW(models::generate(*m.model, prompt, o), Error);
  EXPECT_THROW(models::generate(*m.model, from_vector({1.0}, {1, 1}), {}), Error);
  // A sliding-window model refuses contexts beyond its window rather than attending in full.
  auto cfg = testing::tiny_llama_config();
  cfg.sliding_window = 4;
  models::Llama mistral_like(cfg);
  auto [ids, tgt] = testing::repeating_batch(1, 6);
  EXPECT_THROW(mistral_like.forward(ids), Error);
}

}  // namespace
}  // namespace ingot
