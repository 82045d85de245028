#include "testing.h"

namespace ingot {
namespace {

using testing::leaf;

TEST(Dropout, ZeroesAboutPOfTheElementsAndScalesTheRest) {
  manual_seed(31);
  const double p = 0.3;
  Tensor y = dropout(ones({100, 100}), p);
  int64_t zeros_seen = 0;
  for (double v : y.to_vector()) {
    if (v == 0.0) ++zeros_seen;
    else ASSERT_NEAR(v, 1.0 / (1.0 - p), 1e-6);
  }
  // Binomial(10000, 0.3) has a standard deviation of 46: 0.3 +- 0.02 is more than 4 sigma.
  EXPECT_NEAR(static_cast<double>(zeros_seen) / 10000.0, p, 0.02);
}

TEST(Dropout, SameSeedAndOffsetGiveTheSameMaskAndNextCallsDiffer) {
  Tensor x = randn({1000});
  manual_seed(32);
  Tensor a = dropout(x, 0.5), b = dropout(x, 0.5);
  manual_seed(32);
  Tensor a2 = dropout(x, 0.5);
  EXPECT_EQ(a.to_vector(), a2.to_vector());
  EXPECT_NE(a.to_vector(), b.to_vector());
  // Rewinding the offset replays the second draw.
  Generator& g = default_generator(Device::cpu());
  g.set_offset(1000);
  EXPECT_EQ(dropout(x, 0.5).to_vector(), b.to_vector());
}

TEST(Dropout, EvalModeAndZeroProbabilityAreTheIdentity) {
  Tensor x = randn({4, 5});
  EXPECT_TRUE(dropout(x, 0.5, /*training=*/false).same(x));
  EXPECT_TRUE(dropout(x, 0.0).same(x));
}

TEST(Dropout, ProbabilityOneGivesZerosNotNaN) {
  Tensor y = dropout(randn({64}), 1.0);
  for (double v : y.to_vector()) EXPECT_EQ(v, 0.0);
}

TEST(Dropout, BackwardUsesTheForwardMask) {
  manual_seed(33);
  Tensor x = leaf(add(rand({50, 40}, DType::f64), 0.5));  // nonzero, so y == 0 exactly where dropped
  Tensor y = dropout(x, 0.25);
  sum(y).backward();
  std::vector<double> yv = y.to_vector(), gv = x.grad().to_vector();
  for (size_t i = 0; i < yv.size(); ++i) ASSERT_EQ(gv[i], yv[i] == 0.0 ? 0.0 : 1.0 / 0.75) << i;
}

TEST(Dropout, GradientMatchesFiniteDifferencesWithAFixedSeed) {
  Tensor x = leaf(testing::randn_noncontig({6, 7}));
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& v) {
        manual_seed(34);  // every evaluation draws the same mask
        return std::vector<Tensor>{dropout(v[0], 0.4)};
      },
      {x});
}

TEST(Dropout, LowPrecisionInputsKeepTheirDtype) {
  manual_seed(35);
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    Tensor y = dropout(ones({256}, dt), 0.5);
    EXPECT_EQ(y.dtype(), dt);
    for (double v : y.to_vector()) ASSERT_TRUE(v == 0.0 || v == 2.0) << v;
  }
}

TEST(Dropout, ProbabilityOutsideTheUnitIntervalIsAnError) {
  try {
    dropout(ones({3}), 1.5);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dropout: p must be in [0, 1], got 1.5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ingot
