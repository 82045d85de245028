// Parity with transformers on the committed fixtures (tests/fixtures/hf, made by tests/fixtures/make_fixtures.py):
// logits, the causal-LM loss, every parameter gradient and greedy generation, for GPT-2 and the Llama family.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "models/generate.h"
#include "models/hf_checkpoint.h"
#include "runtime/safetensors.h"

namespace ingot {
namespace {

using models::HFModel;

std::string fixture(const std::string& name) { return std::string(INGOT_SOURCE_DIR) + "/tests/fixtures/hf/" + name; }

// Largest |a - b| / max|b|: the error relative to the tensor's scale.
double scaled_error(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector(), y = b.to_vector();
  EXPECT_EQ(x.size(), y.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < y.size(); ++i) scale = std::max(scale, std::abs(y[i]));
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return scale > 0 ? worst / scale : worst;
}

class HFParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HFParity, LogitsLossAndEveryGradientMatchTransformersInF32) {
  const std::string dir = fixture(GetParam());
  ASSERT_TRUE(std::filesystem::exists(dir + "/reference.safetensors")) << dir;
  HFModel m = models::load_hf_model(dir);
  SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  Tensor ids = ref.get("input_ids");
  Tensor logits = m.model->forward(ids);
  ASSERT_EQ(logits.shape(), ref.info("logits").shape);
  // Elementwise: |ours - theirs| <= 1e-4 * |theirs| + 1e-5 (logits are O(1)).
  EXPECT_LE(max_rel_error(logits, ref.get("logits"), 1e-4, 1e-5), 1.0) << "logits, worst scaled error "
                                                                        << scaled_error(logits, ref.get("logits"));
  Tensor loss = models::lm_loss(logits, models::shifted_targets(ids));
  const double want = ref.get("loss").item();
  EXPECT_NEAR(loss.item(), want, 1e-5 * std::abs(want)) << "loss";
  loss.backward();

  size_t compared = 0;
  double worst_grad = 0;
  for (auto& [name, p] : m.model->named_parameters()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(ref.has("grad." + name)) << "transformers has no parameter " << name;
    Tensor g = p.grad();
    ASSERT_TRUE(g.defined());
    Tensor theirs = ref.get("grad." + name);
    if (models::hf_is_transposed(m.config, name)) theirs = transpose(theirs, 0, 1);
    // Gradients mix sums over the batch: compare against the tensor's own scale.
    const double e = scaled_error(g, theirs);
    EXPECT_LE(e, 1e-4);
    worst_grad = std::max(worst_grad, e);
    ++compared;
  }
  // The measured agreement, for the record (ctest -V / the test log).
  std::printf("[ parity ] %s: logits max|diff|/max|ref| %.2e, loss |diff| %.2e, worst gradient %.2e over %zu\n",
              GetParam().c_str(), scaled_error(logits, ref.get("logits")), std::abs(loss.item() - want), worst_grad,
              compared);
  size_t ref_grads = 0;
  for (const std::string& n : ref.names()) ref_grads += n.rfind("grad.", 0) == 0;
  EXPECT_EQ(compared, ref_grads) << "transformers has parameters this model lacks";
}

TEST_P(HFParity, GreedyGenerationWithTheKVCacheReproducesTransformersIds) {
  const std::string dir = fixture(GetParam());
  HFModel m = models::load_hf_model(dir);
  SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  Tensor want = ref.get("generate_ids");
  Tensor prompt = narrow(narrow(ref.get("input_ids"), 0, 0, 1), 1, 0, 8);
  models::GenerateOptions o;
  o.max_new_tokens = want.size(1) - 8;
  Tensor got = models::generate(*m.model, prompt, o);
  EXPECT_EQ(got.to_vector(), want.to_vector());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HFParity,
                         ::testing::Values("gpt2_tiny", "llama_tiny", "llama3_tiny", "qwen2_tiny", "mistral_tiny",
                                           "qwen3_tiny"),
                         [](const auto& info) { return info.param; });

TEST(HFCheckpoint, ShardedLoadEqualsSingleFileLoad) {
  HFModel single = models::load_hf_model(fixture("llama_tiny"));
  HFModel sharded = models::load_hf_model(fixture("llama_tiny_sharded"));
  EXPECT_EQ(models::hf_weight_files(fixture("llama_tiny_sharded")).size(), single.model->named_parameters().size());
  auto a = single.model->state_dict(), b = sharded.model->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (auto& [name, t] : a) EXPECT_EQ(t.to_vector(), b.at(name).to_vector()) << name;
}

TEST(HFCheckpoint, LoadsStraightIntoBf16) {
  HFModel f32 = models::load_hf_model(fixture("qwen2_tiny"));
  HFModel bf = models::load_hf_model(fixture("qwen2_tiny"), DType::bf16);
  for (auto& [name, p] : bf.model->named_parameters()) ASSERT_EQ(p.dtype(), DType::bf16) << name;
  Tensor w32 = f32.model->state_dict().at("model.layers.0.self_attn.q_proj.weight");
  Tensor w16 = bf.model->state_dict().at("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(w16.to_vector(), w32.to(DType::bf16).to_vector());
  SafetensorsFile ref = SafetensorsFile::open(fixture("qwen2_tiny") + "/reference.safetensors");
  Tensor logits = bf.model->forward(ref.get("input_ids"));
  // bf16 weights and activations: about 2-3 significant digits.
  EXPECT_LE(scaled_error(logits, ref.get("logits")), 0.05);
}

}  // namespace
}  // namespace ingot
