// The eval and generate recipes on the tiny Hugging Face fixtures: perplexity is exp of the mean loss over
// scored tokens whatever the batching, and generate matches models::generate with and without a KV cache.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "models/hf_checkpoint.h"
#include "recipes/eval.h"
#include "recipes/generate.h"

namespace ingot::recipes {
namespace {

Config eval_config(std::vector<std::string> extra = {}) {
  Config c = Config::parse(
      "recipe: eval\ndevice: cpu\nmodel: {path: tests/fixtures/hf/llama_tiny}\n"
      "tokenizer: {path: tests/fixtures/data/tokenizer}\n"
      "data: {format: text, path: tests/fixtures/data/kjv_eval.txt, seq_len: 64}\n",
      "eval.yaml");
  for (const std::string& o : extra) c.apply_override(o);
  c.validate(eval_schema());
  return c;
}

Config generate_config(std::vector<std::string> extra = {}) {
  Config c = Config::parse(
      "recipe: generate\ndevice: cpu\nmodel: {path: tests/fixtures/hf/llama3_tiny}\n"
      "tokenizer: {path: tests/fixtures/data/tokenizer}\n"
      "generate: {prompt: 'In the beginning God created', max_new_tokens: 12}\n",
      "gen.yaml");
  for (const std::string& o : extra) c.apply_override(o);
  c.validate(generate_schema());
  return c;
}

TEST(EvalRecipe, PerplexityIsExpOfTheMeanLossAndDoesNotDependOnTheBatching) {
  std::ostringstream log;
  EvalResult a = run_eval(resolve_eval(eval_config({"eval.batch_size=5"})), log);  // 32 rows: 6 batches + 2
  EvalResult b = run_eval(resolve_eval(eval_config({"eval.batch_size=1"})), log);
  EXPECT_EQ(a.rows, 32);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_NEAR(a.loss, b.loss, 1e-5);
  EXPECT_DOUBLE_EQ(a.perplexity, std::exp(a.loss));
  EXPECT_GT(a.loss, 5.0);  // a random tiny model is near uniform over 512 tokens (ln 512 = 6.24)
  EXPECT_NE(log.str().find("eval | loss"), std::string::npos) << log.str();
  EXPECT_NE(eval_json(a).find("\"perplexity\""), std::string::npos);

  EvalResult first = run_eval(resolve_eval(eval_config({"eval.batch_size=4", "eval.max_batches=2"})), log);
  EXPECT_EQ(first.rows, 8);
}

TEST(EvalRecipe, AMissingAdapterDirectoryIsAConfigErrorNamingTheKey) {
  try {
    resolve_eval(eval_config({"model.adapter=/nonexistent/adapter"}));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.adapter: '/nonexistent/adapter' holds no adapter_config.json"),
              std::string::npos)
        << e.what();
  }
}

TEST(GenerateRecipe, GreedyEqualsTheModelsGenerateWithAndWithoutTheCache) {
  std::ostringstream log;
  GenerateResult cached = run_generate(resolve_generate(generate_config()), log);
  GenerateResult plain = run_generate(resolve_generate(generate_config({"generate.use_cache=false"})), log);
  ASSERT_FALSE(cached.new_ids.empty());
  EXPECT_EQ(cached.new_ids, plain.new_ids);
  EXPECT_EQ(cached.completion, plain.completion);

  models::HFModel hf = models::load_hf_model("tests/fixtures/hf/llama3_tiny");
  std::vector<int64_t> ids(cached.prompt_ids.begin(), cached.prompt_ids.end());
  models::GenerateOptions o;
  o.max_new_tokens = 12;
  o.eos_token_ids = {2, 511};  // config.json's eos and the tokenizer's <|endoftext|>
  Tensor out = models::generate(*hf.model, from_vector_i64(ids, {1, static_cast<int64_t>(ids.size())}), o);
  std::vector<double> all = out.to_vector();
  std::vector<int32_t> want;
  for (size_t i = ids.size(); i < all.size(); ++i) want.push_back(static_cast<int32_t>(all[i]));
  EXPECT_EQ(cached.new_ids, want);
  EXPECT_NE(log.str().find("greedy, KV cache"), std::string::npos) << log.str();
}

TEST(GenerateRecipe, SamplingIsReproducibleBySeedAndChatPromptsUseTheTemplate) {
  std::ostringstream log;
  std::vector<std::string> sample = {"generate.do_sample=true", "generate.temperature=1.5", "generate.top_k=50",
                                     "generate.top_p=0.9", "seed=7"};
  GenerateResult a = run_generate(resolve_generate(generate_config(sample)), log);
  GenerateResult b = run_generate(resolve_generate(generate_config(sample)), log);
  EXPECT_EQ(a.new_ids, b.new_ids);
  sample.back() = "seed=8";
  GenerateResult c = run_generate(resolve_generate(generate_config(sample)), log);
  EXPECT_NE(a.new_ids, c.new_ids);

  GenerateResult chat = run_generate(resolve_generate(generate_config({"generate.chat_template=chatml"})), log);
  EXPECT_EQ(chat.prompt, "<|im_start|>user\nIn the beginning God created<|im_end|>\n<|im_start|>assistant\n");
}

TEST(GenerateRecipe, TooManyNewTokensForTheModelAreNamed) {
  std::ostringstream log;
  try {
    run_generate(resolve_generate(generate_config({"generate.max_new_tokens=60"})), log);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("generate.max_new_tokens"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ingot::recipes
