#include <cmath>
#include <string>

#include "testing.h"

namespace ingot {
namespace {

using testing::error_of;
using testing::leaf;
using testing::randn_noncontig;

// Per-row cross-entropy by explicit loops (PyTorch's definition of label smoothing); 0 for ignored rows.
std::vector<double> naive_ce_rows(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t classes,
                                  int64_t ignore, double ls) {
  std::vector<double> out;
  for (size_t r = 0; r < t.size(); ++r) {
    const double* row = &x[r * classes];
    if (t[r] == ignore) {
      out.push_back(0.0);
      continue;
    }
    double mx = -INFINITY, s = 0, smooth = 0;
    for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, row[c]);
    for (int64_t c = 0; c < classes; ++c) s += std::exp(row[c] - mx);
    const double lse = mx + std::log(s);
    for (int64_t c = 0; c < classes; ++c) smooth += (lse - row[c]) / classes;
    out.push_back((1 - ls) * (lse - row[t[r]]) + ls * smooth);
  }
  return out;
}

Tensor targets(const std::vector<int64_t>& t, const Shape& shape) { return from_vector_i64(t, shape); }

TEST(CrossEntropy, MatchesNaiveLoopsForEveryReductionWithIgnoreIndexAndLabelSmoothing) {
  manual_seed(30);
  Tensor x = mul(randn({6, 5}, DType::f64), 2.0);
  const std::vector<int64_t> t = {0, 4, -100, 2, 3, -100};
  for (double ls : {0.0, 0.1}) {
    SCOPED_TRACE("label_smoothing " + std::to_string(ls));
    const std::vector<double> rows = naive_ce_rows(x.to_vector(), t, 5, -100, ls);
    double total = 0;
    for (double v : rows) total += v;
    Tensor none = cross_entropy(x, targets(t, {6}), -100, ls, Reduction::None);
    EXPECT_EQ(none.dtype(), DType::f64);
    EXPECT_LE(max_rel_error(none, from_vector(rows, {6}, DType::f64), 1e-12, 1e-14), 1.0);
    EXPECT_NEAR(cross_entropy(x, targets(t, {6}), -100, ls, Reduction::Sum).item(), total, 1e-12);
    // Mean divides by the 4 targets that are not ignored, not by 6 rows.
    EXPECT_NEAR(cross_entropy(x, targets(t, {6}), -100, ls, Reduction::Mean).item(), total / 4, 1e-12);
  }
}

TEST(CrossEntropy, GradientsMatchFiniteDifferencesForEveryReduction) {
  manual_seed(31);
  const std::vector<int64_t> t = {1, 7, 0, 3};  // 7 is the ignore_index here
  for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum})
    for (double ls : {0.0, 0.2}) {
      SCOPED_TRACE("reduction " + std::to_string(static_cast<int>(red)) + " label_smoothing " + std::to_string(ls));
      Tensor x = leaf(randn_noncontig({4, 5}));
      EXPECT_GRADCHECK(
          [&](const std::vector<Tensor>& v) {
            return std::vector<Tensor>{cross_entropy(v[0], targets(t, {4}), 7, ls, red)};
          },
          {x});
    }
}

TEST(CrossEntropy, FlattensLeadingDimsOfLogitsAndTargets) {
  manual_seed(32);
  Tensor x = leaf(randn({2, 3, 4}, DType::f64));
  Tensor t = targets({0, 1, 2, 3, 0, -100}, {2, 3});
  Tensor none = cross_entropy(x, t, -100, 0.0, Reduction::None);
  EXPECT_EQ(none.shape(), (Shape{2, 3}));
  std::vector<double> want = naive_ce_rows(x.to_vector(), {0, 1, 2, 3, 0, -100}, 4, -100, 0.0);
  EXPECT_LE(max_rel_error(none, from_vector(want, {2, 3}, DType::f64), 1e-12, 1e-14), 1.0);
  EXPECT_GRADCHECK([t](const std::vector<Tensor>& v) { return std::vector<Tensor>{cross_entropy(v[0], t)}; }, {x});
}

TEST(CrossEntropy, IsStableForHugeLogitsAndManyRows) {
  manual_seed(33);
  const int64_t rows = 64, classes = 1024;  // enough work to run threaded
  Tensor x = leaf(add(mul(randn({rows, classes}), 50.0), 1e4));
  Tensor t = randint(0, classes, {rows});
  Tensor loss = cross_entropy(x, t, -100, 0.1);
  EXPECT_EQ(loss.dtype(), DType::f32);
  ASSERT_TRUE(std::isfinite(loss.item()));
  std::vector<double> want = naive_ce_rows(x.to_vector(), [&] {
    std::vector<int64_t> v;
    for (double d : t.to_vector()) v.push_back(static_cast<int64_t>(d));
    return v;
  }(), classes, -100, 0.1);
  double mean = 0;
  for (double v : want) mean += v / rows;
  EXPECT_NEAR(loss.item(), mean, 1e-3 * std::abs(mean));
  loss.backward();
  // Every row's gradient sums to zero (softmax minus a distribution), scaled by 1/rows. Logits near 1e4 are
  // themselves only known to f32's ulp there (~1e-3), which bounds how well the probabilities can sum to 1.
  std::vector<double> g = x.grad().to_vector();
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < classes; ++c) s += g[r * classes + c];
    EXPECT_NEAR(s, 0.0, 2e-3 / rows);
  }
}

TEST(CrossEntropy, Bf16LogitsGiveAnF32LossAndBf16Gradients) {
  manual_seed(34);
  Tensor x32 = mul(randn({8, 50}), 3.0);
  Tensor t = randint(0, 50, {8});
  Tensor x = leaf(x32.to(DType::bf16));
  Tensor loss = cross_entropy(x, t, -100, 0.1);
  EXPECT_EQ(loss.dtype(), DType::f32);
  loss.backward();
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  Tensor xr = leaf(x.detach().to(DType::f32));  // the same rounded logits in f32
  Tensor lr = cross_entropy(xr, t, -100, 0.1);
  lr.backward();
  EXPECT_NEAR(loss.item(), lr.item(), 1e-5 * std::abs(lr.item()));
  EXPECT_LE(max_rel_error(x.grad().to(DType::f32), xr.grad(), 1.0 / 128, 1e-4), 1.0);
}

TEST(CrossEntropy, AllTargetsIgnoredGiveZeroSumAndZeroGradient) {
  Tensor x = leaf(randn({3, 4}, DType::f64));
  Tensor loss = cross_entropy(x, targets({-1, -1, -1}, {3}), -1, 0.0, Reduction::Sum);
  EXPECT_EQ(loss.item(), 0.0);
  loss.backward();
  for (double g : x.grad().to_vector()) EXPECT_EQ(g, 0.0);
}

TEST(CrossEntropy, BadTargetsAreErrorsNamingTheOp) {
  std::string msg = error_of([] { cross_entropy(randn({2, 3}), from_vector({0, 1}, {2})); });
  EXPECT_NE(msg.find("cross_entropy: expected target of dtype i64, got f32"), std::string::npos) << msg;
  msg = error_of([] { cross_entropy(randn({2, 3}), targets({0, 3}, {2})); });
  EXPECT_NE(msg.find("cross_entropy: target 3 at row 1"), std::string::npos) << msg;
  msg = error_of([] { cross_entropy(randn({2, 3}), targets({0, 1, 2}, {3})); });
  EXPECT_NE(msg.find("cross_entropy: target [3] does not match logits [2, 3]"), std::string::npos) << msg;
  msg = error_of([] { cross_entropy(randn({2, 3}), targets({0, 1}, {2}), -100, 1.5); });
  EXPECT_NE(msg.find("cross_entropy: label_smoothing"), std::string::npos) << msg;
}

// Note [Logits in chunks] (autograd/ops/loss.cpp): linear_cross_entropy is cross_entropy(linear(x, w)) in every
// chunking (a chunk of one row, chunks that divide the rows and one that does not, one chunk larger than all of
// them), every reduction, with ignored rows and label smoothing; x's gradient under per-row cotangents (None) too,
// and with a mean or a sum (scaled by a cotangent other than 1) w's gradient summed over the chunks.
TEST(LinearCrossEntropy, MatchesCrossEntropyOfTheLinearInEveryChunkingAndReduction) {
  manual_seed(33);
  const Tensor x0 = randn({3, 3, 6}, DType::f64), w0 = mul(randn({11, 6}, DType::f64), 0.7);
  const Tensor t = targets({0, 10, -100, 4, 4, 7, -100, 1, 9}, {3, 3});
  const Tensor row_cot = randn({3, 3}, DType::f64);
  for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum})
    for (double ls : {0.0, 0.1}) {
      const bool trained = red != Reduction::None;
      Tensor xr = leaf(x0), wr = trained ? leaf(w0) : w0;
      Tensor ref = cross_entropy(linear(xr, wr), t, -100, ls, red);
      (red == Reduction::None ? sum(mul(ref, row_cot)) : mul(ref, 1.7)).backward();
      for (int64_t chunk : {0, 1, 2, 4, 9, 20}) {
        SCOPED_TRACE(detail::str_cat("reduction ", static_cast<int>(red), " ls ", ls, " chunk_rows ", chunk));
        Tensor x = leaf(x0), w = trained ? leaf(w0) : w0;
        Tensor got = linear_cross_entropy(x, w, t, -100, ls, red, chunk);
        ASSERT_EQ(got.shape(), ref.shape());
        EXPECT_LE(max_rel_error(got, ref, 1e-12, 1e-13), 1.0);
        (red == Reduction::None ? sum(mul(got, row_cot)) : mul(got, 1.7)).backward();
        EXPECT_LE(max_rel_error(x.grad(), xr.grad(), 1e-12, 1e-13), 1.0);
        if (trained) {
          ASSERT_TRUE(w.grad().defined());
          EXPECT_LE(max_rel_error(w.grad(), wr.grad(), 1e-12, 1e-13), 1.0);
        }
      }
    }
}

TEST(LinearCrossEntropy, GradientsMatchFiniteDifferences) {
  manual_seed(34);
  const Tensor w = randn({6, 5}, DType::f64);
  const std::vector<int64_t> t = {1, 5, 7, 3};  // 7 is the ignore_index here
  for (Reduction red : {Reduction::None, Reduction::Mean})
    for (int64_t chunk : {1, 3}) {
      SCOPED_TRACE(detail::str_cat("reduction ", static_cast<int>(red), " chunk_rows ", chunk));
      Tensor x = leaf(randn_noncontig({4, 5}));
      EXPECT_GRADCHECK(
          [&](const std::vector<Tensor>& v) {
            return std::vector<Tensor>{linear_cross_entropy(v[0], w, targets(t, {4}), 7, 0.1, red, chunk)};
          },
          {x});
    }
  // A trained head: w's gradient from the chunks, under a mean and a sum.
  for (Reduction red : {Reduction::Mean, Reduction::Sum})
    for (int64_t chunk : {1, 3}) {
      SCOPED_TRACE(detail::str_cat("trained head, reduction ", static_cast<int>(red), " chunk_rows ", chunk));
      Tensor x = leaf(randn_noncontig({4, 5})), wt = leaf(randn({6, 5}, DType::f64));
      EXPECT_GRADCHECK(
          [&](const std::vector<Tensor>& v) {
            return std::vector<Tensor>{linear_cross_entropy(v[0], v[1], targets(t, {4}), 7, 0.1, red, chunk)};
          },
          (std::vector<Tensor>{x, wt}));
    }
}

// bf16: the same products and row kernels as cross_entropy(linear(x, w)) on each chunk, so the same loss and the
// same gradient up to bf16's rounding of the gradient (cast after the row scale instead of before).
TEST(LinearCrossEntropy, Bf16MatchesCrossEntropyOfTheLinearAndGivesAnF32Loss) {
  manual_seed(35);
  const Tensor x0 = randn({16, 32}, DType::f64).to(DType::bf16), w = mul(randn({50, 32}, DType::f64), 0.2).to(DType::bf16);
  std::vector<int64_t> tv;
  for (int i = 0; i < 16; ++i) tv.push_back(i % 5 == 4 ? -100 : (i * 7) % 50);
  const Tensor t = targets(tv, {16});
  Tensor xr = leaf(x0), x = leaf(x0), wr = leaf(w), wt = leaf(w);
  Tensor ref = cross_entropy(linear(xr, wr), t);
  ref.backward();
  Tensor got = linear_cross_entropy(x, wt, t, -100, 0.0, Reduction::Mean, 5);
  got.backward();
  EXPECT_EQ(got.dtype(), DType::f32);
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  EXPECT_NEAR(got.item(), ref.item(), 1e-6 * std::abs(ref.item()));
  EXPECT_LE(max_rel_error(x.grad(), xr.grad(), 1e-2, 1e-4), 1.0);
  // w's gradient adds the chunks' products in bf16 (rounded at each of the 4 chunks, once unchunked).
  EXPECT_EQ(wt.grad().dtype(), DType::bf16);
  EXPECT_LE(max_rel_error(wt.grad(), wr.grad(), 2e-2, 1e-4), 1.0);
}

// Without grad mode nothing but the loss is computed, and a weight that needs a gradient is an error naming it when
// the rows are not reduced (its gradient would not follow the rows' cotangents).
TEST(LinearCrossEntropy, NoGradModeComputesTheLossAloneAndATrainedWeightIsAnErrorNamingIt) {
  manual_seed(36);
  Tensor x = leaf(randn({4, 3}, DType::f64));
  const Tensor w = randn({5, 3}, DType::f64), t = targets({0, 1, 2, 3}, {4});
  Tensor with_grad = linear_cross_entropy(x, w, t);
  Tensor plain;
  {
    NoGradGuard ng;
    plain = linear_cross_entropy(x, w, t);
  }
  EXPECT_FALSE(plain.requires_grad());
  EXPECT_NEAR(plain.item(), with_grad.item(), 1e-14);
  Tensor trained = leaf(randn({5, 3}, DType::f64));
  trained.set_name("lm_head.weight");
  const std::string e = error_of([&] { linear_cross_entropy(x, trained, t, -100, 0.0, Reduction::None); });
  EXPECT_NE(e.find("linear_cross_entropy"), std::string::npos) << e;
  EXPECT_NE(e.find("lm_head.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("mean or sum"), std::string::npos) << e;
  EXPECT_NO_THROW(linear_cross_entropy(x, trained, t));
  // No rows: the sum is 0 and w's gradient zero.
  Tensor w0 = leaf(randn({5, 3}, DType::f64));
  linear_cross_entropy(leaf(randn({0, 3}, DType::f64)), w0, targets({}, {0}), -100, 0.0, Reduction::Sum).backward();
  ASSERT_TRUE(w0.grad().defined());
  for (double g : w0.grad().to_vector()) EXPECT_EQ(g, 0.0);
  {
    NoGradGuard ng;
    EXPECT_NO_THROW(linear_cross_entropy(x, trained, t, -100, 0.0, Reduction::None));
  }
}

TEST(MseLoss, MatchesNaiveLoopsAndFiniteDifferences) {
  manual_seed(35);
  Tensor a = leaf(randn_noncontig({3, 4})), b = leaf(randn({3, 4}, DType::f64));
  const std::vector<double> av = a.to_vector(), bv = b.to_vector();
  double want = 0;
  for (size_t i = 0; i < av.size(); ++i) want += (av[i] - bv[i]) * (av[i] - bv[i]) / av.size();
  EXPECT_NEAR(mse_loss(a, b).item(), want, 1e-12);
  EXPECT_GRADCHECK([](const std::vector<Tensor>& v) { return std::vector<Tensor>{mse_loss(v[0], v[1])}; }, {a, b});
  EXPECT_EQ(mse_loss(randn({4}).to(DType::bf16), randn({4}).to(DType::bf16)).dtype(), DType::f32);
  std::string msg = error_of([] { mse_loss(randn({3, 1}), randn({3})); });
  EXPECT_NE(msg.find("mse_loss: shapes differ"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ingot
