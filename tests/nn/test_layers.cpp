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
