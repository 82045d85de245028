#include <cmath>

#include "autograd/nn/layers.h"
#include "param_gradcheck.h"

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

TEST(Layers, LinearComputesXTimesWeightTransposedPlusBias) {
  manual_seed(1);
  nn::Linear fc(3, 2);
  Tensor x = randn({4, 3});
  std::vector<double> w = fc.weight().to_vector(), b = fc.bias().to_vector(), xv = x.to_vector();
  std::vector<double> y = fc.forward(x).to_vector();
  for (int r = 0; r < 4; ++r)
    for (int o = 0; o < 2; ++o) {
      double ref = b[o];
      for (int i = 0; i < 3; ++i) ref += xv[r * 3 + i] * w[o * 3 + i];
      EXPECT_NEAR(y[r * 2 + o], ref, 1e-5);
    }
}

TEST(Layers, LinearDefaultInitIsUniformWithinOneOverSqrtFanIn) {
  manual_seed(2);
  nn::Linear fc(64, 32);
  const double bound = 1.0 / 8.0;
  double lo = 1, hi = -1;
  for (double v : fc.weight().to_vector()) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -0.9 * bound);  // fills the range
  EXPECT_GT(hi, 0.9 * bound);
  nn::Linear normal(64, 32, false, 0.02);
  EXPECT_FALSE(normal.bias().defined());
  std::vector<double> v = normal.weight().to_vector();
  double ss = 0;
  for (double x : v) ss += x * x;
  EXPECT_NEAR(std::sqrt(ss / v.size()), 0.02, 0.002);
}

TEST(Layers, LinearAndNormsMatchFiniteDifferences) {
  manual_seed(3);
  nn::Linear fc(5, 3);
  nn::LayerNorm ln(3);
  nn::RMSNorm rms(3);
  fc.to(DType::f64);
  ln.to(DType::f64);
  rms.to(DType::f64);
  {  // non-trivial affine parameters
    NoGradGuard ng;
    ln.named_parameters()[0].second.copy_(randn({3}, DType::f64));
    ln.named_parameters()[1].second.copy_(randn({3}, DType::f64));
    rms.named_parameters()[0].second.copy_(randn({3}, DType::f64));
  }
  Tensor x = testing::randn_noncontig({2, 4, 5});
  auto f = [&] { return weighted(rms.forward(ln.forward(fc.forward(x))), 11); };
  expect_param_grads(fc, f, {"weight", "bias"});
  expect_param_grads(ln, f, {"weight", "bias"});
  expect_param_grads(rms, f, {"weight"});
  Tensor xl = leaf(randn({2, 5}, DType::f64));
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{ln.forward(fc.forward(in[0]))}; },
                   {xl});
}

TEST(Layers, EmbeddingLooksUpRows) {
  manual_seed(4);
  nn::Embedding emb(10, 4);
  Tensor ids = from_vector_i64({3, 0, 3, 9}, {2, 2});
  Tensor y = emb.forward(ids);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 4}));
  std::vector<double> w = emb.weight().to_vector(), yv = y.to_vector();
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(yv[j], w[3 * 4 + j]);
    EXPECT_EQ(yv[12 + j], w[9 * 4 + j]);
  }
}

TEST(Layers, SwiGLUAndMLPHaveHuggingFaceNamesAndCorrectGradients) {
  manual_seed(5);
  nn::SwiGLU swiglu(4, 6);
  nn::MLP mlp(4, 8);
  EXPECT_EQ(names_of(swiglu), (std::vector<std::string>{"gate_proj.weight", "up_proj.weight", "down_proj.weight"}));
  EXPECT_EQ(names_of(mlp),
            (std::vector<std::string>{"c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"}));
  swiglu.to(DType::f64);
  mlp.to(DType::f64);
  Tensor x = randn({3, 4}, DType::f64);
  auto f = [&] { return weighted(mlp.forward(swiglu.forward(x)), 12); };
  expect_param_grads(swiglu, f, {"gate_proj.weight", "up_proj.weight", "down_proj.weight"});
  expect_param_grads(mlp, f, {"c_fc.weight", "c_fc.bias", "c_proj.weight"});
}

TEST(Layers, AttentionWithGqaAndRopeMatchesFiniteDifferences) {
  manual_seed(6);
  nn::AttentionConfig cfg;
  cfg.dim = 16;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.rope = true;
  cfg.qkv_bias = true;
  nn::CausalSelfAttention attn(cfg);
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

TEST(Layers, AttentionIsCausal) {
  manual_seed(7);
  nn::AttentionConfig cfg;
  cfg.dim = 8;
  cfg.n_head = 2;
  cfg.fused_qkv = true;
  cfg.qkv_bias = cfg.out_bias = true;
  nn::CausalSelfAttention attn(cfg);
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

TEST(Layers, TransformerBlocksMatchFiniteDifferences) {
  for (auto style : {nn::BlockConfig::Style::GPT2, nn::BlockConfig::Style::Llama}) {
    SCOPED_TRACE(style == nn::BlockConfig::Style::GPT2 ? "gpt2" : "llama");
    manual_seed(8);
    nn::BlockConfig cfg;
    cfg.style = style;
    cfg.attn.dim = 8;
    cfg.attn.n_head = 2;
    cfg.attn.fused_qkv = style == nn::BlockConfig::Style::GPT2;
    cfg.attn.rope = style == nn::BlockConfig::Style::Llama;
    cfg.intermediate = 12;
    nn::TransformerBlock block(cfg);
    block.to(DType::f64);
    Tensor x = randn({2, 4, 8}, DType::f64);
    auto f = [&] { return weighted(block.forward(x), 14); };
    std::vector<std::string> names;
    for (auto& [n, _] : block.named_parameters()) names.push_back(n);
    expect_param_grads(block, f, names, 3);
  }
}

TEST(Layers, DropoutScalesKeptElementsOnlyInTraining) {
  manual_seed(9);
  nn::Dropout d(0.25);
  Tensor x = ones({1000});
  std::vector<double> y = d.forward(x).to_vector();
  int zeros_seen = 0;
  for (double v : y) {
    if (v == 0) ++zeros_seen;
    else EXPECT_NEAR(v, 1.0 / 0.75, 1e-6);
  }
  EXPECT_NEAR(zeros_seen, 250, 60);
  d.eval();
  EXPECT_TRUE(d.forward(x).same(x));
  EXPECT_THROW(nn::Dropout(1.0), Error);
}

}  // namespace
}  // namespace ingot
