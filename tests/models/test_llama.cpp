#include <cmath>

#include "../nn/param_gradcheck.h"
#include "optim/optimizer.h"
#include "tiny_models.h"

namespace ingot {
namespace {

using models::Llama;

TEST(Llama, ForwardGivesLogitsOfShapeBatchTimeVocab) {
  manual_seed(1);
  Llama model(testing::tiny_llama_config());
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  EXPECT_EQ(model.forward(ids).shape(), (Shape{2, 8, 64}));
  EXPECT_NEAR(model.loss(ids, tgt).item(), std::log(64.0), 0.3);
}

TEST(Llama, ParameterNamesAndCountFollowHuggingFace) {
  Llama model(testing::tiny_llama_config());
  auto named = model.named_parameters();
  std::vector<std::string> first;
  for (size_t i = 0; i < 10; ++i) first.push_back(named[i].first);
  EXPECT_EQ(first, (std::vector<std::string>{
                       "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                       "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                       "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                       "model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.gate_proj.weight",
                       "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"}));
  EXPECT_EQ(named[named.size() - 2].first, "model.norm.weight");
  EXPECT_EQ(named.back().first, "lm_head.weight");
  // GQA: k/v project to 2 heads of 8.
  EXPECT_EQ(model.state_dict().at("model.layers.1.self_attn.k_proj.weight").shape(), (Shape{16, 32}));
  // embed 2048 + 2 layers * (norms 64 + q 1024 + k 512 + v 512 + o 1024 + mlp 3 * 2048) + norm 32 + lm_head 2048
  EXPECT_EQ(model.num_parameters(), 2048 + 2 * 9280 + 32 + 2048);
}

TEST(Llama, QkvBiasAndTiedEmbeddingsChangeTheParameterSet) {
  auto cfg = testing::tiny_llama_config();
  cfg.attention_bias = true;
  cfg.tie_word_embeddings = true;
  Llama model(cfg);
  auto sd = model.state_dict();
  EXPECT_EQ(sd.count("lm_head.weight"), 0u);
  EXPECT_EQ(sd.at("model.layers.0.self_attn.q_proj.bias").shape(), Shape{32});
  EXPECT_EQ(sd.at("model.layers.0.self_attn.v_proj.bias").shape(), Shape{16});
  EXPECT_EQ(sd.count("model.layers.0.self_attn.o_proj.bias"), 0u);
  EXPECT_EQ(model.num_parameters(), 2048 + 2 * (9280 + 64) + 32);
  auto [ids, tgt] = testing::repeating_batch(1, 4);
  EXPECT_EQ(model.forward(ids).shape(), (Shape{1, 4, 64}));
}

TEST(Llama, LossGradientMatchesFiniteDifferencesInF64) {
  manual_seed(3);
  auto cfg = testing::tiny_llama_config();
  cfg.hidden_size = 16;
  cfg.intermediate_size = 24;
  cfg.attention_bias = true;
  Llama model(cfg);
  model.to(DType::f64);
  auto [ids, tgt] = testing::repeating_batch(2, 5);
  testing::expect_param_grads(
      model, [&] { return model.loss(ids, tgt); },
      {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.bias",
       "model.layers.1.mlp.gate_proj.weight", "model.norm.weight", "lm_head.weight"},
      3);
}

TEST(Llama, ThirtyAdamWStepsOnARepeatingSequenceLowerTheLoss) {
  manual_seed(4);
  Llama model(testing::tiny_llama_config());
  const auto [first, last] = testing::first_and_last_adamw_losses(model);
  EXPECT_LT(last, 0.05 * first) << "first " << first << " last " << last;
}

}  // namespace
}  // namespace ingot
