// Philox4x32-10 against the Random123 known answer, the distributions drawn from it, and the generators.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "runtime/rng.h"
#include "runtime/tensor.h"

namespace ingot {
namespace {

struct Moments {
  double mean = 0, std = 0, min = INFINITY, max = -INFINITY;
};
Moments moments(const std::vector<double>& v) {
  Moments m;
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.std += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(m.std / static_cast<double>(v.size() - 1));
  return m;
}

// Random123's kat_vectors: philox4x32 10 rounds, counter {0,0,0,0}, key {0,0}.
TEST(Rng, Philox4x32MatchesTheRandom123KnownAnswer) {
  Philox4 r = philox4x32_10(0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

TEST(Rng, PhiloxDependsOnEveryBitOfSeedAndCounter) {
  std::set<uint32_t> firsts;
  firsts.insert(philox4x32_10(0, 0).v[0]);
  for (int b = 0; b < 64; ++b) {
    firsts.insert(philox4x32_10(uint64_t{1} << b, 0).v[0]);
    firsts.insert(philox4x32_10(0, uint64_t{1} << b).v[0]);
  }
  EXPECT_EQ(firsts.size(), 129u);
}

TEST(Rng, UniformDrawsLieInZeroOneWithTheRightMoments) {
  std::vector<double> v(100000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = philox_uniform(42, i);
  Moments m = moments(v);
  EXPECT_GE(m.min, 0.0);
  EXPECT_LT(m.max, 1.0);
  EXPECT_NEAR(m.mean, 0.5, 0.005);               // standard error ~0.0009
  EXPECT_NEAR(m.std, std::sqrt(1.0 / 12), 0.005);
  // Every tenth of [0, 1) gets about a tenth of the draws.
  std::vector<int> bins(10);
  for (double x : v) ++bins[static_cast<size_t>(x * 10)];
  for (int b : bins) EXPECT_NEAR(b, 10000, 500);
}

TEST(Rng, NormalDrawsHaveMeanZeroAndUnitStd) {
  std::vector<double> v(100000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = philox_normal(7, i);
  for (double x : v) ASSERT_TRUE(std::isfinite(x));
  Moments m = moments(v);
  EXPECT_NEAR(m.mean, 0.0, 0.015);  // standard error ~0.003
  EXPECT_NEAR(m.std, 1.0, 0.015);
  size_t within1 = 0;
  for (double x : v) within1 += std::abs(x) < 1.0;
  EXPECT_NEAR(static_cast<double>(within1) / v.size(), 0.6827, 0.01);
}

TEST(Rng, TensorDrawsUseConsecutiveIndicesFromTheGeneratorOffset) {
  manual_seed(123);
  Generator& g = default_generator(Device::cpu());
  EXPECT_EQ(g.seed(), 123u);
  EXPECT_EQ(g.offset(), 0u);
  Tensor a = rand({5}, DType::f32);
  EXPECT_EQ(g.offset(), 8u);  // 5 elements round up to two counters of 4
  Tensor b = randn({3}, DType::f64);
  EXPECT_EQ(g.offset(), 12u);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(a.item_at(i), philox_uniform(123, static_cast<uint64_t>(i)));
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_EQ(b.item_at(i), static_cast<double>(philox_normal(123, 8 + static_cast<uint64_t>(i))));
}

TEST(Rng, ManualSeedReproducesDrawsAndOtherSeedsDiffer) {
  manual_seed(5);
  std::vector<double> first = randn({64}, DType::f32).to_vector();
  std::vector<double> second = randn({64}, DType::f32).to_vector();
  manual_seed(5);
  EXPECT_EQ(randn({64}, DType::f32).to_vector(), first);
  EXPECT_NE(second, first);
  manual_seed(6);
  EXPECT_NE(randn({64}, DType::f32).to_vector(), first);
}

TEST(Rng, RandAndRandnHonourRangeMeanAndStd) {
  manual_seed(9);
  Moments u = moments(rand({100000}, DType::f64, Device::cpu(), -2.0, 3.0).to_vector());
  EXPECT_GE(u.min, -2.0);
  EXPECT_LT(u.max, 3.0);
  EXPECT_NEAR(u.mean, 0.5, 0.03);
  Moments n = moments(randn({100000}, DType::f32, Device::cpu(), 1.5, 0.5).to_vector());
  EXPECT_NEAR(n.mean, 1.5, 0.01);
  EXPECT_NEAR(n.std, 0.5, 0.01);
  Moments h = moments(randn({100000}, DType::bf16).to_vector());
  EXPECT_NEAR(h.mean, 0.0, 0.02);
  EXPECT_NEAR(h.std, 1.0, 0.02);
}

TEST(Rng, RandintCoversTheHalfOpenRangeOnly) {
  manual_seed(10);
  Tensor r = randint(-3, 4, {20000});
  EXPECT_EQ(r.dtype(), DType::i64);
  std::vector<int> counts(7);
  for (double x : r.to_vector()) {
    ASSERT_GE(x, -3);
    ASSERT_LT(x, 4);
    ++counts[static_cast<size_t>(x + 3)];
  }
  for (int c : counts) EXPECT_NEAR(c, 20000 / 7, 250);
}

}  // namespace
// Note [Stochastic rounding] (runtime/kernels/scalar_math.h): each result is one of x's two bf16 neighbours, and
// over many salts their mean is x (round-to-nearest would give the nearer neighbour every time: off by at least a
// quarter of the gap for the fractions below).
TEST(StochasticRounding, GivesANeighbourAndIsUnbiased) {
  for (float raw : {1.0f, -0.015625f, 3.0e-5f, -1234.0f}) {
    const float lo = bf16_to_float(float_to_bf16(raw));
    const float gap = bf16_to_float(static_cast<uint16_t>(float_to_bf16(lo) + 1)) - lo;  // lo's next bf16 up
    for (double frac : {0.25, 0.5, 0.75, 0.0625}) {
      const float x = lo + static_cast<float>(frac) * gap;
      const int n = 20000;
      double sum = 0;
      int ups = 0;
      for (int i = 0; i < n; ++i) {
        const float r = ig_math::round_bf16_stochastic(x, ig_math::stochastic_salt(i, 7));
        ASSERT_TRUE(r == lo || r == lo + gap) << x << " rounded to " << r;
        ASSERT_EQ(bf16_to_float(float_to_bf16(r)), r) << "not a bf16 value";
        ups += r != lo;
        sum += r;
      }
      // Binomial: the fraction rounded away from lo is |frac| within 5 standard deviations.
      const double p = static_cast<double>(ups) / n, sd = std::sqrt(frac * (1 - frac) / n);
      EXPECT_NEAR(p, frac, 5 * sd) << "x = " << x;
      EXPECT_NEAR(sum / n, x, 5 * sd * std::abs(gap)) << "x = " << x;
    }
  }
}

TEST(StochasticRounding, KeepsBf16ValuesAndNonFiniteOnesAndDependsOnTheSalt) {
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 0.0078125f}) EXPECT_EQ(ig_math::round_bf16_stochastic(v, 123), v);
  EXPECT_TRUE(std::isinf(ig_math::round_bf16_stochastic(INFINITY, 5)));
  EXPECT_TRUE(std::isnan(ig_math::round_bf16_stochastic(NAN, 5)));
  // The same value and salt round alike (what makes eager, compiled and resumed runs equal); other steps differ.
  const float x = 1.0f + 0.5f * 0.0078125f;
  std::set<float> by_step;
  for (int step = 1; step <= 64; ++step) {
    const long long salt = ig_math::stochastic_salt(3, step);
    EXPECT_EQ(ig_math::round_bf16_stochastic(x, salt), ig_math::round_bf16_stochastic(x, salt));
    by_step.insert(ig_math::round_bf16_stochastic(x, salt));
  }
  EXPECT_EQ(by_step.size(), 2u);
}

// Note [Stochastic rounding]: a kernel holding eight consecutive elements draws one Philox block for them and
// rounds each as round_bf16_stochastic does alone; element j of two tensors (equal salts) does not round with one
// number.
TEST(StochasticRounding, EightElementsShareOnePhiloxCallAndValuesOfOtherTensorsRoundApart) {
  for (long long base : {0LL, 8LL, 4096LL, (1LL << 40) * 3 + 64}) {
    const ig_math::Philox4 r = ig_math::stochastic_block(base);
    for (int k = 0; k < 8; ++k)
      for (float x : {1.00390625f + 3e-4f, -0.0123f, 7.77e-3f, 12345.678f})
        EXPECT_EQ(ig_math::round_bf16_with(x, ig_math::stochastic_bits(r, k)),
                  ig_math::round_bf16_stochastic(x, base + k))
            << "salt " << base + k << ", x " << x;
  }
  // Halfway between neighbours: one number would round both alike every time.
  const float a = 1.0f + 0.5f * 0.0078125f, b = -3.0f - 0.5f * 0.015625f;
  int same = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const long long salt = ig_math::stochastic_salt(i, 11);
    same += (ig_math::round_bf16_stochastic(a, salt) != a - 0.5f * 0.0078125f) ==
            (ig_math::round_bf16_stochastic(b, salt) != b + 0.5f * 0.015625f);
  }
  EXPECT_LT(same, n);
}

}  // namespace ingot
