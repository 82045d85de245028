#include <cmath>
#include <limits>

#include "runtime/kernels/kernels.h"
#include "testing.h"

namespace ingot {
namespace {

using testing::leaf;
using testing::randn_noncontig;

enum class Ref { Sum, Mean, Max, Min, LogSumExp };

// A naive reference: reduces `x` over `dims` (sorted, non-empty) in double, keepdim layout flattened.
std::vector<double> reference(const Tensor& x, const std::vector<int64_t>& dims, Ref op) {
  const Shape& s = x.shape();
  Shape ks = s;
  for (int64_t d : dims) ks[static_cast<size_t>(d)] = 1;
  const std::vector<double> v = x.to_vector();
  const int64_t nout = numel(ks);
  std::vector<std::vector<double>> groups(static_cast<size_t>(nout));
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t rem = i, o = 0, mult = 1;
    for (int64_t d = x.dim() - 1; d >= 0; --d) {
      int64_t idx = rem % s[static_cast<size_t>(d)];
      rem /= s[static_cast<size_t>(d)];
      if (ks[static_cast<size_t>(d)] != 1) o += idx * mult;
      mult *= ks[static_cast<size_t>(d)];
    }
    groups[static_cast<size_t>(o)].push_back(v[static_cast<size_t>(i)]);
  }
  std::vector<double> r;
  for (const auto& g : groups) {
    double acc = op == Ref::Max ? -INFINITY : op == Ref::Min ? INFINITY : 0.0;
    for (double e : g) {
      if (op == Ref::Max) acc = std::max(acc, e);
      else if (op == Ref::Min) acc = std::min(acc, e);
      else if (op == Ref::LogSumExp) acc += std::exp(e);
      else acc += e;
    }
    if (op == Ref::Mean) acc /= static_cast<double>(g.size());
    if (op == Ref::LogSumExp) acc = std::log(acc);
    r.push_back(acc);
  }
  return r;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "at " << i;
}

TEST(Reduce, EveryOpMatchesANaiveReferenceOverEverySubsetOfDims) {
  manual_seed(10);
  // A transposed input, a dense permutation (read in memory order, output written through a permuted
  // view), and a broadcast input (stride 0: copied first).
  for (const Tensor& x : {randn_noncontig({3, 4, 5, 2}), permute(randn({5, 3, 2, 4}, DType::f64), {1, 3, 0, 2}),
                          expand(randn({3, 1, 5, 1}, DType::f64), {3, 4, 5, 2})}) {
    const std::vector<std::pair<Ref, Tensor (*)(const Tensor&, std::vector<int64_t>, bool)>> ops = {
        {Ref::Sum, sum}, {Ref::Mean, mean}, {Ref::Max, amax}, {Ref::Min, amin}, {Ref::LogSumExp, logsumexp}};
    for (int mask = 1; mask < 16; ++mask) {
      std::vector<int64_t> dims;
      for (int64_t d = 0; d < 4; ++d)
        if (mask & (1 << d)) dims.push_back(d);
      for (auto [ref, f] : ops) {
        SCOPED_TRACE(::testing::Message() << "op " << static_cast<int>(ref) << " dims " << shape_str(dims));
        Tensor kept = f(x, dims, true);
        Shape ks = x.shape();
        for (int64_t d : dims) ks[static_cast<size_t>(d)] = 1;
        EXPECT_EQ(kept.shape(), ks);
        expect_near_all(kept.to_vector(), reference(x, dims, ref), 1e-12);
        Tensor dropped = f(x, dims, false);
        EXPECT_EQ(dropped.to_vector(), kept.to_vector());
        EXPECT_EQ(dropped.dim(), x.dim() - static_cast<int64_t>(dims.size()));
      }
    }
  }
}

TEST(Reduce, EmptyDimsReduceEverythingAndNegativeDimsWrap) {
  Tensor x = reshape(arange(0, 12, DType::f32), {3, 4});
  Tensor all = sum(x);
  EXPECT_EQ(all.shape(), Shape{});
  EXPECT_EQ(all.item(), 66.0);
  EXPECT_EQ(sum(x, {}, true).shape(), (Shape{1, 1}));
  EXPECT_EQ(sum(x, {-1}).to_vector(), (std::vector<double>{6, 22, 38}));
  EXPECT_EQ(mean(x, {0}).to_vector(), (std::vector<double>{4, 5, 6, 7}));
  EXPECT_EQ(amax(x, {1}).to_vector(), (std::vector<double>{3, 7, 11}));
  EXPECT_EQ(amin(x, {0}).to_vector(), (std::vector<double>{0, 1, 2, 3}));
  Tensor scalar = full({}, 2.5, DType::f64);
  EXPECT_EQ(sum(scalar).item(), 2.5);
  EXPECT_EQ(sum(scalar, {0}).item(), 2.5);
}

TEST(Reduce, ArgMaxAndArgMinReturnTheFirstExtremeAsInt64) {
  Tensor x = from_vector({1, 5, 5, 0,
                          2, 2, -1, -1,
                          7, 3, 7, 3},
                         {3, 4});
  Tensor am = argmax(x, 1);
  EXPECT_EQ(am.dtype(), DType::i64);
  EXPECT_EQ(am.to_vector(), (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(argmin(x, 1).to_vector(), (std::vector<double>{3, 2, 1}));
  EXPECT_EQ(argmax(x, 0).to_vector(), (std::vector<double>{2, 0, 2, 2}));
  EXPECT_EQ(argmin(x, -2, true).shape(), (Shape{1, 4}));
  EXPECT_EQ(argmin(x, 0).to_vector(), (std::vector<double>{0, 1, 1, 1}));
  EXPECT_FALSE(argmax(leaf(randn({3}, DType::f64)), 0).requires_grad());
  // Indices count along the logical dim whatever the memory layout.
  Tensor xt = transpose(contiguous(transpose(x, 0, 1)), 0, 1);
  EXPECT_EQ(argmax(xt, 1).to_vector(), (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(argmin(xt, 0).to_vector(), (std::vector<double>{0, 1, 1, 1}));
}

TEST(Reduce, LongRowsSplitAcrossThreadsGiveFirstIndexAndAccurateSums) {
  manual_seed(11);
  // One output over 200k elements: the kernel splits the row into segments and combines them.
  const int64_t n = 200000;
  Tensor x = rand({1, n}, DType::f32);
  std::vector<double> v = x.to_vector();
  double ref = 0;
  for (double e : v) ref += e;
  EXPECT_NEAR(sum(x).item(), ref, ref * 1e-7);  // exact up to the final f32 rounding
  EXPECT_NEAR(mean(x, {1}).item(), ref / n, 1e-8);
  // Ties for the maximum in different segments: the first wins.
  Tensor y = zeros({n}, DType::f32);
  for (int64_t at : {150000, 90000, 170000}) narrow(y, 0, at, 1).fill_(3.0);
  EXPECT_EQ(argmax(y, 0).item(), 90000);
  EXPECT_EQ(argmin(neg(y), 0).item(), 90000);
  // A long column reduction with few columns is split the same way.
  Tensor z = rand({70000, 3}, DType::f64);
  expect_near_all(sum(z, {0}).to_vector(), reference(z, {0}, Ref::Sum), 1e-12);
  expect_near_all(logsumexp(z, {0}).to_vector(), reference(z, {0}, Ref::LogSumExp), 1e-12);
  expect_near_all(amax(z, {0}).to_vector(), reference(z, {0}, Ref::Max), 0);
  expect_near_all(logsumexp(x, {1}).to_vector(), reference(x, {1}, Ref::LogSumExp), 1e-6);
  expect_near_all(amin(x).to_vector(), reference(x, {0, 1}, Ref::Min), 0);
}

TEST(Reduce, HalfPrecisionSumsAccumulateInHigherPrecision) {
  // 4096 ones: a bf16 accumulator would stop at 256 (256 + 1 rounds back to 256).
  Tensor x = ones({4096}, DType::bf16);
  Tensor s = sum(x);
  EXPECT_EQ(s.dtype(), DType::bf16);
  EXPECT_EQ(s.item(), 4096.0);
  EXPECT_EQ(sum(ones({2, 3000}, DType::f16), {1}).to_vector(), (std::vector<double>{3000, 3000}));
  EXPECT_EQ(mean(full({5000}, 0.5, DType::bf16)).item(), 0.5);
}

TEST(Reduce, IntegerSumsAreExactInt64AndMeanNeedsFloats) {
  Tensor x = from_vector_i64({(int64_t(1) << 53) + 1, 1, 3}, {3});
  Tensor s = sum(x);
  EXPECT_EQ(s.dtype(), DType::i64);
  EXPECT_EQ(*s.data<int64_t>(), (int64_t(1) << 53) + 5);
  EXPECT_EQ(sum(from_vector({1, 0, 1, 1}, {4}, DType::b8)).item(), 3.0);
  EXPECT_EQ(amax(x).item(), static_cast<double>((int64_t(1) << 53) + 1));
  EXPECT_THROW(mean(x), Error);
}

TEST(Reduce, MaxAndMinPropagateNaNAndArgMaxPointsAtIt) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = from_vector({1, nan, 3, 4}, {4}, DType::f64);
  EXPECT_TRUE(std::isnan(amax(x).item()));
  EXPECT_TRUE(std::isnan(amin(x).item()));
  EXPECT_EQ(argmax(x, 0).item(), 1.0);
  EXPECT_EQ(argmin(x, 0).item(), 1.0);
}

TEST(Reduce, LogSumExpIsStableForLargeAndInfiniteInputs) {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = from_vector({1000, 1000, -inf, -inf, -inf, -inf, 1, inf, 0}, {3, 3}, DType::f32);
  std::vector<double> r = logsumexp(x, {1}).to_vector();
  EXPECT_NEAR(r[0], 1000 + std::log(2.0), 1e-3);
  EXPECT_EQ(r[1], -inf);
  EXPECT_EQ(r[2], inf);
  EXPECT_NEAR(logsumexp(from_vector({-1000, -1000}, {2}), {0}).item(), -1000 + std::log(2.0), 1e-3);
}

TEST(Reduce, EmptyDimensionsGiveIdentitiesOrClearErrors) {
  Tensor x = zeros({0, 3});
  EXPECT_EQ(sum(x, {0}).to_vector(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(sum(x, {1}).shape(), Shape{0});
  try {
    amax(x, {0});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max: cannot reduce over dim 0 of size 0 in shape [0, 3]"),
              std::string::npos) << e.what();
  }
}

TEST(Reduce, BadDimsNameTheOp) {
  Tensor x = zeros({2, 3});
  try {
    sum(x, {2});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum: dim 2 out of range for a tensor with 2 dims"), std::string::npos)
        << e.what();
  }
  try {
    mean(x, {1, -1});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mean: dim 1 appears more than once"), std::string::npos) << e.what();
  }
}

TEST(Reduce, GradientsMatchFiniteDifferences) {
  manual_seed(12);
  using Fn = Tensor (*)(const Tensor&, std::vector<int64_t>, bool);
  const std::vector<std::pair<const char*, Fn>> ops = {
      {"sum", sum}, {"mean", mean}, {"amax", amax}, {"amin", amin}, {"logsumexp", logsumexp}};
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {1}, {0, 2}, {-1}, {0, 1, 2}};
  for (auto [name, f] : ops)
    for (const auto& dims : dim_sets)
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(::testing::Message() << name << " dims " << shape_str(dims) << " keepdim " << keepdim);
        Tensor x = leaf(randn_noncontig({3, 2, 4}));
        EXPECT_GRADCHECK([f, dims, keepdim](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{f(in[0], dims, keepdim)};
        }, {x});
      }
}

TEST(Reduce, GradientsFlowThroughBroadcastInputs) {
  manual_seed(13);
  Tensor a = leaf(randn({3, 1}, DType::f64));
  Tensor b = leaf(randn_noncontig({3, 4}));
  EXPECT_GRADCHECK([](const std::vector<Tensor>& x) {
    return std::vector<Tensor>{logsumexp(mul(x[0], x[1]), {0}), mean(add(x[0], x[1]), {1}, true)};
  }, {a, b});
}

TEST(Reduce, AmaxSplitsTheGradientEvenlyBetweenTies) {
  Tensor x = leaf(from_vector({1, 3, 3, 2, 2, 2}, {2, 3}, DType::f64));
  sum(amax(x, {1})).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0.5, 0.5, 1.0 / 3, 1.0 / 3, 1.0 / 3}));
  Tensor y = leaf(from_vector({4, 1, 1}, {3}, DType::f64));
  mul(amin(y), 6.0).backward();
  EXPECT_EQ(y.grad().to_vector(), (std::vector<double>{0, 3, 3}));
}

TEST(Reduce, SoftmaxBuiltFromLogSumExpHasCorrectGradients) {
  manual_seed(14);
  Tensor x = leaf(randn({2, 3}, DType::f64));
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) {
    Tensor y = logsumexp(in[0], {1});
    return std::vector<Tensor>{exp(sub(in[0], reshape(y, {2, 1}))), sum(in[0], {1})};
  }, {x});
}

// Note [Narrow wire, wide sum] (distributed/process_group.h): the world's bf16 pieces of a chunk added in f32 in
// piece order and scaled once, whatever their count; bf16 values whose sum needs more than bf16's 8 bits come out
// exact, not rounded to bf16.
TEST(SumPieces, AddsBf16PiecesInF32InOrderAndScalesOnce) {
  const std::vector<double> a{1.0, 256.0, -3.5, 1e-3}, b{1.0 / 256, 1.0, 2.0, 1e-3}, c{0.0, 0.5, 1.5, 1e-3};
  std::vector<Tensor> pieces;
  for (const auto* v : {&a, &b, &c}) pieces.push_back(from_vector(*v, {4}, DType::bf16));
  Tensor out = empty({4}, DType::f32);
  kernels::cpu::sum_pieces(out, pieces, 0.5, 0);
  const std::vector<double> got = out.to_vector();
  for (size_t i = 0; i < 4; ++i) {
    // The same additions in f32 from the bf16-rounded pieces.
    float want = 0;
    for (const Tensor& p : pieces) want += static_cast<float>(p.to_vector()[i]);
    EXPECT_EQ(got[i], static_cast<double>(want * 0.5f)) << i;
  }
  EXPECT_EQ(got[0], (1.0 + 1.0 / 256) * 0.5);  // 1 + 2^-8 does not fit bf16's 8 bits: the sum stayed f32
  EXPECT_EQ(got[1], 257.5 * 0.5);
  // One piece, f64 output, f32 pieces.
  Tensor wide = empty({4}, DType::f64);
  kernels::cpu::sum_pieces(wide, {from_vector(a, {4}, DType::f32)}, 1.0, 0);
  EXPECT_EQ(wide.to_vector()[3], static_cast<double>(1e-3f));
  // Pieces of another length or dtype, and a 16-bit output, are refused.
  EXPECT_THROW(kernels::cpu::sum_pieces(out, {pieces[0], from_vector(a, {4}, DType::f32)}, 1.0, 0), Error);
  EXPECT_THROW(kernels::cpu::sum_pieces(out, {empty({3}, DType::bf16)}, 1.0, 0), Error);
  EXPECT_THROW(kernels::cpu::sum_pieces(empty({4}, DType::bf16), pieces, 1.0, 0), Error);
}

}  // namespace
}  // namespace ingot
