#include <cmath>

#include "../nn/param_gradcheck.h"
#include "optim/optimizer.h"
#include "tiny_models.h"

namespace ingot {
namespace {

using models::GPT2;

TEST(GPT2, ForwardGivesLogitsOfShapeBatchTimeVocab) {
  manual_seed(1);
  GPT2 model(testing::tiny_gpt2_config());
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  Tensor logits = model.forward(ids);
  EXPECT_EQ(logits.shape(), (Shape{2, 8, 64}));
  EXPECT_EQ(logits.dtype(), DType::f32);
  Tensor loss = model.loss(ids, tgt);
  EXPECT_EQ(loss.numel(), 1);
  EXPECT_EQ(loss.dtype(), DType::f32);
  // Small init: close to the uniform-prediction loss log(64).
  EXPECT_NEAR(loss.item(), std::log(64.0), 0.3);
}

TEST(GPT2, ParameterNamesAndCountFollowHuggingFace) {
  GPT2 model(testing::tiny_gpt2_config());
  auto named = model.named_parameters();
  std::vector<std::string> first;
  for (size_t i = 0; i < 8; ++i) first.push_back(named[i].first);
  EXPECT_EQ(first, (std::vector<std::string>{"transformer.wte.weight", "transformer.wpe.weight",
                                             "transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias",
                                             "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
                                             "transformer.h.0.attn.c_proj.weight", "transformer.h.0.attn.c_proj.bias"}));
  EXPECT_EQ(named.back().first, "transformer.ln_f.bias");
  EXPECT_EQ(named.size(), 2u + 2 * 12 + 2);
  // wte 64*32 + wpe 16*32 + 2 blocks * (2 LN 128 + c_attn 3168 + c_proj 1056 + c_fc 4224 + c_proj 4128) + ln_f 64
  EXPECT_EQ(model.num_parameters(), 2048 + 512 + 2 * 12704 + 64);
  auto sd = model.state_dict();
  EXPECT_EQ(sd.at("transformer.h.1.mlp.c_fc.weight").shape(), (Shape{128, 32}));
  EXPECT_EQ(sd.count("lm_head.weight"), 0u);  // tied to wte
  EXPECT_EQ(sd.at("transformer.h.1.attn.c_proj.bias").name(), "transformer.h.1.attn.c_proj.bias");
}

TEST(GPT2, UntiedHeadAddsLmHeadWeight) {
  auto cfg = testing::tiny_gpt2_config();
  cfg.tie_word_embeddings = false;
  GPT2 model(cfg);
  EXPECT_EQ(model.named_parameters().back().first, "lm_head.weight");
  EXPECT_EQ(model.num_parameters(), 2048 + 512 + 2 * 12704 + 64 + 2048);
}

TEST(GPT2, ResidualProjectionsUseScaledInit) {
  manual_seed(2);
  auto cfg = testing::tiny_gpt2_config();
  cfg.n_embd = 64;
  GPT2 model(cfg);
  auto rms = [](const Tensor& t) {
    double ss = 0;
    for (double v : t.to_vector()) ss += v * v;
    return std::sqrt(ss / static_cast<double>(t.numel()));
  };
  auto sd = model.state_dict();
  EXPECT_NEAR(rms(sd.at("transformer.h.0.attn.c_attn.weight")), 0.02, 0.002);
  EXPECT_NEAR(rms(sd.at("transformer.h.0.mlp.c_proj.weight")), 0.02 / 2.0, 0.001);  // / sqrt(2 * n_layer)
  EXPECT_EQ(rms(sd.at("transformer.h.0.attn.c_attn.bias")), 0.0);
}

TEST(GPT2, LossGradientMatchesFiniteDifferencesInF64) {
  manual_seed(3);
  auto cfg = testing::tiny_gpt2_config();
  cfg.n_embd = 16;
  GPT2 model(cfg);
  model.to(DType::f64);
  auto [ids, tgt] = testing::repeating_batch(2, 5);
  testing::expect_param_grads(
      model, [&] { return model.loss(ids, tgt); },
      {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight",
       "transformer.h.1.mlp.c_proj.bias", "transformer.ln_f.weight"},
      3);
}

// With tied embeddings the tiny model first learns the 5-token unigram distribution (loss log 5 = 1.61, from
// log 64 = 4.16) and only later the bigram, so 30 steps check the first; the untied model memorizes the sequence.
TEST(GPT2, ThirtyAdamWStepsOnARepeatingSequenceLowerTheLoss) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    manual_seed(4);
    auto cfg = testing::tiny_gpt2_config();
    cfg.tie_word_embeddings = tied;
    GPT2 model(cfg);
    const auto [first, last] = testing::first_and_last_adamw_losses(model);
    EXPECT_LT(last, tied ? 0.4 * first : 0.05 * first) << "first " << first << " last " << last;
  }
}

TEST(GPT2, Bf16ComputeDtypeKeepsF32ParametersAndGradients) {
  manual_seed(5);
  GPT2 model(testing::tiny_gpt2_config());
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  const double ref = model.loss(ids, tgt).item();
  model.set_compute_dtype(DType::bf16);
  EXPECT_EQ(model.forward(ids).dtype(), DType::bf16);
  Tensor loss = model.loss(ids, tgt);
  EXPECT_EQ(loss.dtype(), DType::f32);
  EXPECT_NEAR(loss.item(), ref, 2e-2 * ref);
  loss.backward();
  for (auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().dtype(), DType::f32) << name;
  }
}

TEST(GPT2, TooLongSequencesAreRejected) {
  GPT2 model(testing::tiny_gpt2_config());
  auto [ids, tgt] = testing::repeating_batch(1, 17);
  EXPECT_THROW(model.forward(ids), Error);
}

}  // namespace
}  // namespace ingot
