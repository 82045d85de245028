#include <cmath>
#include <string>

#include "testing.h"

namespace ingot {
namespace {

using testing::error_of;
using testing::leaf;
using testing::randn_noncontig;

// Softmax along `dim` of row-major values by explicit loops.
std::vector<double> naive_softmax(const std::vector<double>& v, const Shape& shape, int64_t dim, bool log) {
  int64_t n = shape[dim], inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t outer = numel(shape) / (n * inner);
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t k) { return static_cast<size_t>((o * n + k) * inner + i); };
      double mx = -INFINITY, s = 0;
      for (int64_t k = 0; k < n; ++k) mx = std::max(mx, v[at(k)]);
      for (int64_t k = 0; k < n; ++k) s += std::exp(v[at(k)] - mx);
      for (int64_t k = 0; k < n; ++k)
        out[at(k)] = log ? v[at(k)] - mx - std::log(s) : std::exp(v[at(k)] - mx) / s;
    }
  return out;
}

// layer_norm (centered) or rms_norm over the last dim by explicit loops; w / b empty means none.
std::vector<double> naive_norm(const std::vector<double>& x, int64_t cols, const std::vector<double>& w,
                               const std::vector<double>& b, double eps, bool centered) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / cols; ++r) {
    const double* row = &x[r * cols];
    double mu = 0, var = 0;
    if (centered) {
      for (int64_t i = 0; i < cols; ++i) mu += row[i] / cols;
    }
    for (int64_t i = 0; i < cols; ++i) var += (row[i] - mu) * (row[i] - mu) / cols;
    for (int64_t i = 0; i < cols; ++i)
      y[r * cols + i] = (row[i] - mu) / std::sqrt(var + eps) * (w.empty() ? 1.0 : w[i]) + (b.empty() ? 0.0 : b[i]);
  }
  return y;
}

TEST(Softmax, MatchesNaiveLoopsAlongEveryDim) {
  manual_seed(20);
  Tensor x = randn({3, 4, 5}, DType::f64);
  for (bool log : {false, true})
    for (int64_t dim : {0, 1, 2, -1}) {
      SCOPED_TRACE((log ? "log_softmax dim " : "softmax dim ") + std::to_string(dim));
      Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
      std::vector<double> want = naive_softmax(x.to_vector(), x.shape(), dim < 0 ? dim + 3 : dim, log);
      EXPECT_LE(max_rel_error(y, from_vector(want, x.shape(), DType::f64), 1e-12, 1e-14), 1.0);
    }
}

TEST(Softmax, IsStableForHugeLogits) {
  manual_seed(21);
  Tensor x = add(mul(randn({4, 50}), 30.0), 1e4);
  for (double v : softmax(x).to_vector()) ASSERT_TRUE(std::isfinite(v));
  for (double v : log_softmax(x).to_vector()) ASSERT_TRUE(std::isfinite(v));
  std::vector<double> s = softmax(x).to_vector();
  for (int r = 0; r < 4; ++r) {
    double total = 0;
    for (int c = 0; c < 50; ++c) total += s[r * 50 + c];
    EXPECT_NEAR(total, 1.0, 1e-5);
  }
}

TEST(Softmax, GradientsMatchFiniteDifferencesOnNonContiguousInputs) {
  manual_seed(22);
  for (bool log : {false, true})
    for (int64_t dim : {-1, 0, 1}) {
      SCOPED_TRACE((log ? "log_softmax dim " : "softmax dim ") + std::to_string(dim));
      Tensor x = leaf(randn_noncontig({2, 3, 4}));
      EXPECT_GRADCHECK(
          [log, dim](const std::vector<Tensor>& v) {
            return std::vector<Tensor>{log ? log_softmax(v[0], dim) : softmax(v[0], dim)};
          },
          {x});
    }
}

TEST(Softmax, Bf16InputsKeepTheirDtypeAndMatchF32) {
  manual_seed(23);
  Tensor x = mul(randn({6, 40}), 3.0).to(DType::bf16);
  for (bool log : {false, true}) {
    Tensor y = log ? log_softmax(x) : softmax(x);
    EXPECT_EQ(y.dtype(), DType::bf16);
    Tensor want = log ? log_softmax(x.to(DType::f32)) : softmax(x.to(DType::f32));
    EXPECT_LE(max_rel_error(y.to(DType::f32), want, 1.0 / 128, 1e-3), 1.0);
  }
}

TEST(LayerNorm, MatchesNaiveLoopsWithAndWithoutAffineParameters) {
  manual_seed(24);
  Tensor x = add(randn({4, 7}, DType::f64), 3.0), w = randn({7}, DType::f64), b = randn({7}, DType::f64);
  const std::vector<double> xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector();
  auto check = [&](const Tensor& got, const std::vector<double>& want) {
    EXPECT_LE(max_rel_error(got, from_vector(want, x.shape(), DType::f64), 1e-10, 1e-12), 1.0);
  };
  check(layer_norm(x, w, b, 1e-5), naive_norm(xv, 7, wv, bv, 1e-5, true));
  check(layer_norm(x, w, Tensor(), 1e-5), naive_norm(xv, 7, wv, {}, 1e-5, true));
  check(layer_norm(x, Tensor(), Tensor(), 1e-3), naive_norm(xv, 7, {}, {}, 1e-3, true));
  check(rms_norm(x, w, 1e-6), naive_norm(xv, 7, wv, {}, 1e-6, false));
  check(rms_norm(x, Tensor(), 1e-6), naive_norm(xv, 7, {}, {}, 1e-6, false));
}

TEST(LayerNorm, GradientsMatchFiniteDifferencesForEveryParameterCombination) {
  manual_seed(25);
  auto ln = [](const std::vector<Tensor>& v) { return std::vector<Tensor>{layer_norm(v[0], v[1], v[2])}; };
  EXPECT_GRADCHECK(ln, {leaf(randn_noncontig({3, 5})), leaf(randn({5}, DType::f64)), leaf(randn({5}, DType::f64))});
  EXPECT_GRADCHECK(ln, {leaf(randn({2, 3, 4}, DType::f64)), leaf(randn({4}, DType::f64)), Tensor()});
  EXPECT_GRADCHECK(ln, {leaf(randn_noncontig({2, 4, 3})), Tensor(), Tensor()});
  // Frozen input: only the parameters get gradients.
  EXPECT_GRADCHECK(ln, {randn({3, 5}, DType::f64), leaf(randn({5}, DType::f64)), leaf(randn({5}, DType::f64))});
}

TEST(RmsNorm, GradientsMatchFiniteDifferencesWithAndWithoutWeight) {
  manual_seed(26);
  auto rn = [](const std::vector<Tensor>& v) { return std::vector<Tensor>{rms_norm(v[0], v[1])}; };
  EXPECT_GRADCHECK(rn, {leaf(randn_noncontig({3, 5})), leaf(randn({5}, DType::f64))});
  EXPECT_GRADCHECK(rn, {leaf(randn({2, 3, 4}, DType::f64)), Tensor()});
  EXPECT_GRADCHECK(rn, {randn({4, 6}, DType::f64), leaf(randn({6}, DType::f64))});
}

// Enough rows to run threaded and over many row blocks; dx, dw, db against the textbook formulas.
TEST(LayerNorm, BackwardOverManyRowsMatchesNaiveFormulas) {
  manual_seed(27);
  const int64_t rows = 300, cols = 128;
  Tensor x = leaf(randn({rows, cols}, DType::f64)), w = leaf(randn({cols}, DType::f64));
  Tensor b = leaf(randn({cols}, DType::f64));
  Tensor dy = randn({rows, cols}, DType::f64);
  layer_norm(x, w, b).backward(dy);
  const std::vector<double> xv = x.to_vector(), wv = w.to_vector(), gv = dy.to_vector();
  std::vector<double> dx(xv.size()), dw(cols, 0.0), db(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < cols; ++i) mu += xv[r * cols + i] / cols;
    for (int64_t i = 0; i < cols; ++i) var += std::pow(xv[r * cols + i] - mu, 2) / cols;
    const double rs = 1.0 / std::sqrt(var + 1e-5);
    double mg = 0, mgx = 0;
    for (int64_t i = 0; i < cols; ++i) {
      const double xh = (xv[r * cols + i] - mu) * rs, g = gv[r * cols + i] * wv[i];
      mg += g / cols;
      mgx += g * xh / cols;
      dw[i] += gv[r * cols + i] * xh;
      db[i] += gv[r * cols + i];
    }
    for (int64_t i = 0; i < cols; ++i) {
      const double xh = (xv[r * cols + i] - mu) * rs;
      dx[r * cols + i] = rs * (gv[r * cols + i] * wv[i] - mg - xh * mgx);
    }
  }
  EXPECT_LE(max_rel_error(x.grad(), from_vector(dx, {rows, cols}, DType::f64), 1e-9, 1e-11), 1.0);
  EXPECT_LE(max_rel_error(w.grad(), from_vector(dw, {cols}, DType::f64), 1e-9, 1e-11), 1.0);
  EXPECT_LE(max_rel_error(b.grad(), from_vector(db, {cols}, DType::f64), 1e-9, 1e-11), 1.0);
}

TEST(LayerNorm, Bf16InputsUseF32StatisticsAndMatchF32WithinBf16Tolerance) {
  manual_seed(28);
  Tensor x32 = add(randn({8, 64}), 5.0), w32 = randn({64}), b32 = randn({64});
  for (bool centered : {true, false}) {
    SCOPED_TRACE(centered ? "layer_norm" : "rms_norm");
    Tensor x = leaf(x32.to(DType::bf16)), w = leaf(w32.to(DType::bf16)), b = leaf(b32.to(DType::bf16));
    Tensor y = centered ? layer_norm(x, w, b) : rms_norm(x, w);
    EXPECT_EQ(y.dtype(), DType::bf16);
    sum(cast(y, DType::f32)).backward();
    EXPECT_EQ(x.grad().dtype(), DType::bf16);
    EXPECT_EQ(w.grad().dtype(), DType::bf16);
    // The same bf16-rounded values, computed in f32.
    Tensor xr = leaf(x.detach().to(DType::f32)), wr = leaf(w.detach().to(DType::f32));
    Tensor br = leaf(b.detach().to(DType::f32));
    Tensor yr = centered ? layer_norm(xr, wr, br) : rms_norm(xr, wr);
    sum(yr).backward();
    EXPECT_LE(max_rel_error(y.to(DType::f32), yr, 1.0 / 64, 1.0 / 64), 1.0);
    EXPECT_LE(max_rel_error(w.grad().to(DType::f32), wr.grad(), 1.0 / 64, 1.0 / 16), 1.0);
    EXPECT_LE(max_rel_error(x.grad().to(DType::f32), xr.grad(), 1.0 / 32, 1.0 / 16), 1.0);
  }
}

TEST(LayerNorm, WeightOfTheWrongShapeIsAnErrorNamingTheOp) {
  std::string msg = error_of([] { layer_norm(randn({2, 5}), randn({4}), Tensor()); });
  EXPECT_NE(msg.find("layer_norm: weight has shape [4], expected [5]"), std::string::npos) << msg;
  msg = error_of([] { layer_norm(randn({2, 5}), randn({5}), randn({5, 1})); });
  EXPECT_NE(msg.find("layer_norm: bias"), std::string::npos) << msg;
  msg = error_of([] { rms_norm(randn({2, 5}), randn({2, 5})); });
  EXPECT_NE(msg.find("rms_norm: weight"), std::string::npos) << msg;
  msg = error_of([] { softmax(arange(0, 4)); });
  EXPECT_NE(msg.find("softmax: expected a floating tensor"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ingot
