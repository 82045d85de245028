#include <string>

#include "runtime/kernels/kernels.h"
#include "testing.h"

namespace ingot {
namespace {

using testing::error_of;
using testing::leaf;
using testing::randn_noncontig;

// Index into an operand's batch for a flat index of the broadcast batch (numpy rules, right-aligned).
int64_t batch_index(const Shape& batch, int64_t flat, const Shape& own) {
  int64_t idx = 0, stride = 1;
  for (size_t d = batch.size(); d-- > 0;) {
    int64_t i = flat % batch[d];
    flat /= batch[d];
    size_t off = batch.size() - own.size();
    if (d < off) continue;
    int64_t n = own[d - off];
    if (n != 1) idx += i * stride;
    stride *= n;
  }
  return idx;
}

// numpy matmul by explicit loops; returns values in row-major order of the result shape.
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b, Shape* out_shape) {
  Shape sa = a.shape(), sb = b.shape();
  if (sa.size() == 1) sa.insert(sa.begin(), 1);
  if (sb.size() == 1) sb.push_back(1);
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const Shape batch = broadcast_shapes(ba, bb, "test");
  const std::vector<double> av = a.to_vector(), bv = b.to_vector();
  std::vector<double> out;
  for (int64_t p = 0; p < numel(batch); ++p) {
    const int64_t ia = batch_index(batch, p, ba), ib = batch_index(batch, p, bb);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t q = 0; q < k; ++q) acc += av[ia * m * k + i * k + q] * bv[ib * k * n + q * n + j];
        out.push_back(acc);
      }
  }
  *out_shape = batch;
  if (a.dim() > 1) out_shape->push_back(m);
  if (b.dim() > 1) out_shape->push_back(n);
  return out;
}

void expect_matches_naive(const Tensor& a, const Tensor& b, double tol = 1e-12) {
  SCOPED_TRACE(shape_str(a.shape()) + " @ " + shape_str(b.shape()));
  Shape shape;
  std::vector<double> want = naive_matmul(a, b, &shape);
  Tensor got = matmul(a, b);
  ASSERT_EQ(got.shape(), shape);
  EXPECT_LE(max_rel_error(got, from_vector(want, shape, got.dtype()), tol, tol), 1.0);
}

const std::vector<std::pair<Shape, Shape>> kRankCombos = {
    {{4}, {4}},          {{4}, {4, 3}},          {{2, 4}, {4}},         {{2, 4}, {4, 3}},
    {{5, 2, 4}, {4, 3}}, {{2, 4}, {5, 4, 3}},    {{5, 2, 4}, {5, 4, 3}}, {{2, 1, 2, 4}, {3, 4, 3}},
    {{5, 2, 4}, {4}},    {{4}, {5, 4, 3}},       {{1, 2, 4}, {5, 4, 3}}, {{2, 3, 2, 4}, {3, 4, 3}},
};

TEST(Matmul, MatchesNaiveLoopsForEveryRankAndBroadcastCombination) {
  manual_seed(10);
  for (const auto& [sa, sb] : kRankCombos) expect_matches_naive(randn(sa, DType::f64), randn(sb, DType::f64));
}

TEST(Matmul, GradientsMatchFiniteDifferencesWithBroadcastBatches) {
  manual_seed(11);
  for (const auto& [sa, sb] : kRankCombos) {
    SCOPED_TRACE(shape_str(sa) + " @ " + shape_str(sb));
    Tensor a = leaf(randn_noncontig(sa)), b = leaf(randn_noncontig(sb));
    EXPECT_GRADCHECK([](const std::vector<Tensor>& x) { return std::vector<Tensor>{matmul(x[0], x[1])}; }, {a, b});
  }
}

TEST(Matmul, TransposedAndStridedInputsGiveTheSameValues) {
  manual_seed(12);
  expect_matches_naive(randn_noncontig({3, 5}), randn_noncontig({5, 4}));
  expect_matches_naive(randn_noncontig({2, 3, 5}), randn_noncontig({2, 5, 4}));
  // Every other column of a [3, 10] buffer: neither contiguous nor a transpose, so it is copied.
  Tensor base = randn({3, 10}, DType::f64);
  Tensor strided = base.as_strided({3, 5}, {10, 2}, base.offset() + 1);
  expect_matches_naive(strided, randn({5, 2}, DType::f64));
  expect_matches_naive(randn({4, 3}, DType::f64), strided);
  Tensor a = leaf(randn_noncontig({2, 3, 5})), w = leaf(randn_noncontig({5, 4}));
  EXPECT_GRADCHECK([](const std::vector<Tensor>& x) { return std::vector<Tensor>{matmul(x[0], x[1])}; }, {a, w});
}

TEST(Matmul, F32MatchesF64AndBf16AndF16MatchF32WithinTheirPrecision) {
  manual_seed(13);
  Tensor a = randn({3, 6, 32}), b = randn({32, 5});
  Tensor ref = matmul(a.to(DType::f64), b.to(DType::f64));
  EXPECT_LE(max_rel_error(matmul(a, b), ref, 1e-5, 1e-5), 1.0);
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Tensor al = a.to(t), bl = b.to(t);
    Tensor got = matmul(al, bl);
    EXPECT_EQ(got.dtype(), t);
    // Same rounded inputs in f32: the only difference is the final rounding of each output.
    Tensor want = matmul(al.to(DType::f32), bl.to(DType::f32));
    const double eps = t == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
    EXPECT_LE(max_rel_error(got.to(DType::f32), want, eps, eps), 1.0);
  }
}

TEST(Matmul, KernelScalesByAlphaAccumulatesWithBetaAndBroadcastsABatchOfOne) {
  manual_seed(14);
  for (DType t : {DType::f32, DType::f64, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Tensor a = randn({1, 3, 4}, t), b = randn({2, 5, 4}, t), c0 = randn({2, 3, 5}, t);
    Tensor out = c0.clone_raw();
    kernels::cpu::matmul(out, a, b, false, /*trans_b=*/true, 2.0, 0.5);
    Shape shape;
    std::vector<double> prod = naive_matmul(a.to(DType::f64), transpose(b.to(DType::f64), 1, 2), &shape);
    std::vector<double> c = c0.to_vector();
    for (size_t i = 0; i < prod.size(); ++i) prod[i] = 2.0 * prod[i] + 0.5 * c[i];
    const double tol = t == DType::bf16 ? 2.0 / 128 : 1e-5;
    EXPECT_LE(max_rel_error(out.to(DType::f64), from_vector(prod, shape, DType::f64), tol, tol), 1.0);
  }
}

TEST(Matmul, EmptyInnerDimGivesZeros) {
  Tensor out = matmul(randn({3, 0}), randn({0, 2}));
  EXPECT_EQ(out.shape(), (Shape{3, 2}));
  EXPECT_EQ(out.to_vector(), std::vector<double>(6, 0.0));
  EXPECT_EQ(matmul(randn({0, 4}), randn({4, 2})).shape(), (Shape{0, 2}));
}

TEST(Matmul, MismatchedInnerDimsAndIntegerOperandsAreErrorsNamingTheOp) {
  std::string msg = error_of([] { matmul(randn({2, 3}), randn({4, 5})); });
  EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 5]"), std::string::npos) << msg;
  msg = error_of([] { matmul(randn({2, 3, 4}), randn({3, 4, 5})); });
  EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
  msg = error_of([] { matmul(arange(0, 4), arange(0, 4)); });
  EXPECT_NE(msg.find("matmul: expected floating"), std::string::npos) << msg;
  msg = error_of([] { bmm(randn({2, 3}), randn({3, 2})); });
  EXPECT_NE(msg.find("bmm"), std::string::npos) << msg;
}

TEST(Matmul, BmmMatchesNaiveLoopsAndFiniteDifferences) {
  manual_seed(15);
  Tensor a = leaf(randn_noncontig({3, 2, 4})), b = leaf(randn({3, 4, 5}, DType::f64));
  Shape shape;
  std::vector<double> want = naive_matmul(a, b, &shape);
  EXPECT_LE(max_rel_error(bmm(a, b), from_vector(want, shape, DType::f64), 1e-12, 1e-12), 1.0);
  EXPECT_GRADCHECK([](const std::vector<Tensor>& x) { return std::vector<Tensor>{bmm(x[0], x[1])}; }, {a, b});
}

TEST(Linear, MatchesNaiveLoopsWithAndWithoutBias) {
  manual_seed(16);
  Tensor x = randn({2, 3, 4}, DType::f64), w = randn({5, 4}, DType::f64), b = randn({5}, DType::f64);
  std::vector<double> xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector();
  std::vector<double> want_b, want_nb;
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t o = 0; o < 5; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < 4; ++i) acc += xv[r * 4 + i] * wv[o * 4 + i];
      want_nb.push_back(acc);
      want_b.push_back(acc + bv[o]);
    }
  Tensor y = linear(x, w, b);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 5}));
  EXPECT_LE(max_rel_error(y, from_vector(want_b, {2, 3, 5}, DType::f64), 1e-12, 1e-12), 1.0);
  EXPECT_LE(max_rel_error(linear(x, w), from_vector(want_nb, {2, 3, 5}, DType::f64), 1e-12, 1e-12), 1.0);
  Tensor y1 = linear(randn({4}, DType::f64), w, b);
  EXPECT_EQ(y1.shape(), (Shape{5}));
}

TEST(Linear, GradientsMatchFiniteDifferencesForInputWeightAndBias) {
  manual_seed(17);
  auto with_bias = [](const std::vector<Tensor>& v) { return std::vector<Tensor>{linear(v[0], v[1], v[2])}; };
  auto no_bias = [](const std::vector<Tensor>& v) { return std::vector<Tensor>{linear(v[0], v[1])}; };
  EXPECT_GRADCHECK(with_bias, {leaf(randn_noncontig({2, 3, 4})), leaf(randn({5, 4}, DType::f64)),
                               leaf(randn({5}, DType::f64))});
  EXPECT_GRADCHECK(with_bias, {leaf(randn({3, 4}, DType::f64)), leaf(randn_noncontig({5, 4})),
                               leaf(randn({5}, DType::f64))});
  EXPECT_GRADCHECK(no_bias, {leaf(randn({4}, DType::f64)), leaf(randn({5, 4}, DType::f64))});
  // Only the weight trains (a frozen input, as in a first layer).
  EXPECT_GRADCHECK(no_bias, {randn({3, 4}, DType::f64), leaf(randn({5, 4}, DType::f64))});
}

TEST(Linear, WrongFeatureCountOrBiasShapeIsAnErrorNamingTheOp) {
  std::string msg = error_of([] { linear(randn({2, 3}), randn({5, 4})); });
  EXPECT_NE(msg.find("linear"), std::string::npos) << msg;
  msg = error_of([] { linear(randn({2, 4}), randn({5, 4}), randn({4})); });
  EXPECT_NE(msg.find("linear: bias"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ingot
