// The decoder blocks GPT-2 and the Llama family are built from (models/decoder.h): Hugging Face parameter names,
// parameter gradients and input gradients against finite differences in f64, causality.
#include <cmath>

#include "models/decoder.h"
#include "nn/param_gradcheck.h"

namespace ingot {
namespace {

using testing::expect_param_grads;
using testing::leaf;

// Weighted sum of a module output, so every output element matters to the gradient.
Tensor weighted(const Tensor& y, uint64_t seed) {
  manual_seed(seed);
  return sum(mul(y, randn(y.shape(), y.dtype())));
}

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> n;
  for (auto& [k, _] : m.named_parameters()) n.push_back(k);
  return n;
}

models::DecoderConfig config(models::DecoderConfig::Style style, int64_t dim, int64_t n_head) {
  models::DecoderConfig c;
  c.style = style;
  c.dim = dim;
  c.n_head = n_head;
  c.intermediate = 4 * dim;  // resolved() checks it even where only the attention is built
  return c;
}

TEST(Decoder, SwiGLUAndGeluMlpsHaveHuggingFaceNamesAndCorrectGradients) {
  manual_seed(5);
  models::DecoderConfig llama = config(models::DecoderConfig::Style::Llama, 4, 1), gpt2 = llama;
  llama.intermediate = 6;
  gpt2.style = models::DecoderConfig::Style::GPT2;
  gpt2.intermediate = 8;
  models::DecoderMLP swiglu(llama), mlp(gpt2);
  EXPECT_EQ(names_of(swiglu), (std::vector<std::string>{"gate_proj.weight", "up_proj.weight", "down_proj.weight"}));
  EXPECT_EQ(names_of(mlp), (std::vector<std::string>{"c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"}));
  swiglu.to(DType::f64);
  mlp.to(DType::f64);
  Tensor x = randn({3, 4}, DType::f64);
  auto f = [&] { return weighted(mlp.forward(swiglu.forward(x)), 12); };
  expect_param_grads(swiglu, f, {"gate_proj.weight", "up_proj.weight", "down_proj.weight"});
  expect_param_grads(mlp, f, {"c_fc.weight", "c_fc.bias", "c_proj.weight"});
}

TEST(Decoder, AttentionWithGqaAndRopeMatchesFiniteDifferences) {
  manual_seed(6);
  models::DecoderConfig cfg = config(models::DecoderConfig::Style::Llama, 16, 4);
  cfg.n_kv_head = 2;
  cfg.rope = true;
  cfg.qkv_bias = true;
  models::Attention attn(cfg);
  EXPECT_EQ(names_of(attn), (std::vector<std::string>{"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                                                      "v_proj.weight", "v_proj.bias", "o_proj.weight"}));
  EXPECT_EQ(attn.named_parameters()[2].second.shape(), (Shape{8, 16}));  // 2 kv heads of dim 4
  attn.to(DType::f64);
  Tensor x = randn({2, 5, 16}, DType::f64);
  auto f = [&] { return weighted(attn.forward(x), 13); };
  expect_param_grads(attn, f, {"q_proj.weight", "k_proj.bias", "v_proj.weight", "o_proj.weight"});
  Tensor xl = leaf(randn({1, 3, 16}, DType::f64));
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{attn.forward(in[0])}; }, {xl});
}

TEST(Decoder, AttentionIsCausal) {
  manual_seed(7);
  models::DecoderConfig cfg = config(models::DecoderConfig::Style::GPT2, 8, 2);
  cfg.fused_qkv = true;
  cfg.qkv_bias = cfg.out_bias = true;
  models::Attention attn(cfg);
  EXPECT_EQ(names_of(attn),
            (std::vector<std::string>{"c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias"}));
  Tensor x = randn({1, 6, 8});
  Tensor y = attn.forward(x);
  // Changing the last position must leave the outputs of earlier positions unchanged.
  Tensor x2 = x.clone_raw();
  x2.as_strided({8}, {1}, 5 * 8).copy_(randn({8}));
  Tensor y2 = attn.forward(x2);
  std::vector<double> a = y.to_vector(), b = y2.to_vector();
  for (int i = 0; i < 5 * 8; ++i) EXPECT_NEAR(a[i], b[i], 1e-6);
  double diff = 0;
  for (int i = 5 * 8; i < 6 * 8; ++i) diff += std::abs(a[i] - b[i]);
  EXPECT_GT(diff, 1e-4);
}

TEST(Decoder, BlocksOfBothStylesMatchFiniteDifferences) {
  for (auto style : {models::DecoderConfig::Style::GPT2, models::DecoderConfig::Style::Llama}) {
    const bool gpt2 = style == models::DecoderConfig::Style::GPT2;
    SCOPED_TRACE(gpt2 ? "gpt2" : "llama");
    manual_seed(8);
    models::DecoderConfig cfg = config(style, 8, 2);
    cfg.fused_qkv = gpt2;
    cfg.qkv_bias = cfg.out_bias = gpt2;
    cfg.rope = !gpt2;
    cfg.intermediate = 12;
    models::DecoderBlock block(cfg);
    block.to(DType::f64);
    Tensor x = randn({2, 4, 8}, DType::f64);
    auto f = [&] { return weighted(block.forward(x), 14); };
    expect_param_grads(block, f, names_of(block), 3);
  }
}

}  // namespace
}  // namespace ingot
