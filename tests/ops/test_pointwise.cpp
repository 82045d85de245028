#include "testing.h"

namespace ingot {
namespace {

using testing::leaf;
using testing::randn_noncontig;

TEST(Pointwise, BinaryOpsBroadcastAndMatchFiniteDifferences) {
  manual_seed(1);
  using Fn = Tensor (*)(const Tensor&, const Tensor&);
  for (Fn f : {static_cast<Fn>(add), static_cast<Fn>(sub), static_cast<Fn>(mul), static_cast<Fn>(div),
               static_cast<Fn>(maximum), static_cast<Fn>(minimum)}) {
    Tensor a = leaf(randn_noncontig({3, 4}));
    Tensor b = leaf(add(randn({4}, DType::f64), 3.0));  // keep div away from 0
    EXPECT_GRADCHECK([f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x[0], x[1])}; }, {a, b});
  }
}

TEST(Pointwise, PowMatchesFiniteDifferencesForPositiveBase) {
  manual_seed(2);
  Tensor a = leaf(add(rand({2, 3}, DType::f64), 0.5));
  Tensor b = leaf(randn({1, 3}, DType::f64));
  EXPECT_GRADCHECK([](const std::vector<Tensor>& x) { return std::vector<Tensor>{pow(x[0], x[1])}; }, {a, b});
}

TEST(Pointwise, UnaryOpsMatchFiniteDifferences) {
  manual_seed(3);
  std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"log", [](const Tensor& x) { return log(add(abs(x), 0.5)); }},
      {"sqrt", [](const Tensor& x) { return sqrt(add(abs(x), 0.5)); }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(add(abs(x), 0.5)); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); }},
      {"gelu_erf", [](const Tensor& x) { return gelu(x, false); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"sin", [](const Tensor& x) { return sin(x); }},
      {"cos", [](const Tensor& x) { return cos(x); }},
      {"square", [](const Tensor& x) { return square(x); }},
      {"reciprocal", [](const Tensor& x) { return reciprocal(add(abs(x), 0.5)); }},
      {"pow_scalar", [](const Tensor& x) { return pow(add(abs(x), 0.5), 2.5); }},
      {"scalars", [](const Tensor& x) { return rdiv(rsub(mul(add(x, 1.5), 2.0), 10.0), 3.0); }},
  };
  for (auto& [name, f] : ops) {
    SCOPED_TRACE(name);
    Tensor a = leaf(randn_noncontig({4, 3}));
    EXPECT_GRADCHECK([&f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x[0])}; }, {a});
  }
}

// relu2 is defined by its kernel expression alone (Note [Pointwise formulas]): eagerly it is relu(x)^2 computed in
// f32 and rounded once into bf16, as a generated kernel computes it.
TEST(Pointwise, Relu2IsTheSquaredReluRoundedOnce) {
  manual_seed(5);
  const Tensor x = randn({4, 33}, DType::f32);
  EXPECT_EQ(max_rel_error(relu2(x), square(relu(x)), 0, 0), 0.0);
  const Tensor xb = x.to(DType::bf16);
  const Tensor want = square(relu(xb.to(DType::f32))).to(DType::bf16);
  EXPECT_EQ(relu2(xb).dtype(), DType::bf16);
  EXPECT_EQ(max_rel_error(relu2(xb).to(DType::f32), want.to(DType::f32), 0, 0), 0.0);
  const Tensor xt = transpose(x, 0, 1);  // strided input
  EXPECT_EQ(max_rel_error(relu2(xt), square(relu(xt)), 0, 0), 0.0);
  Tensor a = leaf(randn_noncontig({3, 5}));
  EXPECT_GRADCHECK([](const std::vector<Tensor>& v) { return std::vector<Tensor>{relu2(v[0])}; }, {a});
}

TEST(Pointwise, WhereRoutesGradientsByCondition) {
  manual_seed(4);
  Tensor c = gt(randn({3, 4}, DType::f64), zeros({}, DType::f64));
  Tensor a = leaf(randn({3, 4}, DType::f64));
  Tensor b = leaf(randn({4}, DType::f64));
  EXPECT_GRADCHECK([c](const std::vector<Tensor>& x) { return std::vector<Tensor>{where(c, x[0], x[1])}; }, {a, b});
}

TEST(Pointwise, ComparisonsGiveBoolAndValuesAreExact) {
  Tensor a = from_vector({1, 2, 3}, {3});
  Tensor b = from_vector({2, 2, 2}, {3});
  Tensor r = lt(a, b);
  EXPECT_EQ(r.dtype(), DType::b8);
  EXPECT_EQ(r.to_vector(), (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(ge(a, b).to_vector(), (std::vector<double>{0, 1, 1}));
}

TEST(Pointwise, CastRoundTripsThroughBf16WithinItsPrecision) {
  manual_seed(5);
  Tensor a = randn({64}, DType::f32);
  Tensor back = cast(cast(a, DType::bf16), DType::f32);
  EXPECT_LE(max_rel_error(back, a, 1.0 / 128, 1e-6), 1.0);
  Tensor x = leaf(randn({5}, DType::f64));
  EXPECT_GRADCHECK([](const std::vector<Tensor>& v) { return std::vector<Tensor>{cast(cast(v[0], DType::f32), DType::f64)}; },
                   {x}, 1e-3, 1e-3, 1e-4);
}

TEST(Pointwise, MismatchedShapesNameTheOp) {
  Tensor a = zeros({2, 3}), b = zeros({4});
  try {
    add(a, b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add: shapes [2, 3] and [4] do not broadcast"), std::string::npos) << e.what();
  }
}

TEST(Autograd, GradAccumulatesAcrossBackwardCallsAndHooksRun) {
  Tensor w = leaf(from_vector({1, 2}, {2}, DType::f64));
  int hook_calls = 0, post_calls = 0;
  w.register_hook([&](const Tensor& g) { ++hook_calls; return mul(g, 2.0); });
  w.register_post_accumulate_grad_hook([&](Tensor&) { ++post_calls; });
  sum(mul(w, w)).backward();
  sum(mul(w, 3.0)).backward();
  // d/dw (w^2) = 2w -> doubled by the hook = 4w; then 3 doubled = 6.
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{4 + 6, 8 + 6}));
  EXPECT_EQ(hook_calls, 2);
  EXPECT_EQ(post_calls, 2);
}

TEST(Autograd, NoGradScopeRecordsNothing) {
  Tensor w = leaf(ones({2}));
  Tensor y;
  {
    NoGradGuard g;
    y = mul(w, 2.0);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_THROW(y.backward(), Error);
}

TEST(Autograd, SecondBackwardWithoutRetainGraphIsAnError) {
  Tensor w = leaf(ones({2}));
  Tensor y = sum(exp(w));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_THROW(y.backward(), Error);
}

TEST(Autograd, InPlaceWriteToSavedInputIsDetected) {
  Tensor w = leaf(ones({2}));
  Tensor x = from_vector({1, 2}, {2});
  Tensor y = sum(mul(w, x));
  x.fill_(5.0);
  EXPECT_THROW(y.backward(), Error);
}

}  // namespace
}  // namespace ingot
