// Guards, recompiles, dynamic dims, stances, disable (compile/api.h).
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "compile/api.h"

namespace ingot {
namespace {

// A small function with a captured weight: y = tanh(x @ w) summed over the last dim.
struct Fixture {
  Tensor w = randn({8, 4});
  int calls = 0;
  CompiledFunction::Fn fn = [this](const std::vector<Tensor>& a) {
    ++calls;
    return std::vector<Tensor>{sum(tanh(matmul(a[0], w)), {-1})};
  };
  Tensor eager(const Tensor& x) { return sum(tanh(matmul(x, w)), {-1}); }
};

CompileOptions eager_backend(CompileOptions o = {}) {
  o.backend = CompileBackend::Eager;  // no code generation: these tests are about guards
  return o;
}

TEST(Guards, SameSignatureRunsTheCompiledGraphWithoutRetracing) {
  Fixture f;
  CompiledFunction c = compile(f.fn, eager_backend());
  Tensor x = randn({3, 8});
  c({x});
  Tensor x2 = randn({3, 8});
  Tensor y = c({x2})[0];
  EXPECT_EQ(f.calls, 1) << "the function body runs only while tracing";
  EXPECT_TRUE(allclose(y, f.eager(x2), 1e-6, 1e-7));
  EXPECT_EQ(c.stats().compiles, 1);
  EXPECT_EQ(c.stats().compiled_calls, 1);
}

TEST(Guards, DtypeChangeRecompilesAndNamesTheInput) {
  Fixture f;
  CompiledFunction c = compile(f.fn, eager_backend());
  c({randn({3, 8})});
  f.w = randn({8, 4}, DType::f64);
  c({randn({3, 8}, DType::f64)});
  ASSERT_EQ(c.stats().recompiles, 1);
  EXPECT_NE(c.stats().recompile_reasons[0].find("arg0 dtype changed from f32 to f64"), std::string::npos)
      << c.stats().recompile_reasons[0];
}

TEST(Guards, RequiresGradIsPartOfTheSignature) {
  Fixture f;
  CompiledFunction c = compile(f.fn, eager_backend());
  c({randn({3, 8})});
  c({randn({3, 8}).set_requires_grad(true)});
  ASSERT_EQ(c.stats().recompiles, 1);
  EXPECT_NE(c.stats().recompile_reasons[0].find("requires_grad"), std::string::npos);
}

TEST(Guards, ACapturedTensorThatChangesShapeRecompiles) {
  Fixture f;
  CompiledFunction c = compile(f.fn, eager_backend());
  Tensor x = randn({3, 8});
  c({x});
  f.w.impl()->shape = {8, 2};  // a parameter resized in place (same handle)
  f.w.impl()->strides = {2, 1};
  c({x});
  ASSERT_EQ(c.stats().recompiles, 1);
  EXPECT_NE(c.stats().recompile_reasons[0].find("captured"), std::string::npos) << c.stats().recompile_reasons[0];
}

TEST(Guards, DynamicFalseRecompilesForEverySize) {
  Fixture f;
  CompileOptions o = eager_backend();
  o.dynamic = DynamicMode::False;
  CompiledFunction c = compile(f.fn, o);
  for (int64_t n : {2, 3, 4, 5}) c({randn({n, 8})});
  EXPECT_EQ(c.stats().recompiles, 3);
  EXPECT_EQ(c.stats().specializations, 0);
}

TEST(Guards, DynamicAutoRecompilesOnceThenTreatsTheDimAsDynamic) {
  Fixture f;
  CompiledFunction c = compile(f.fn, eager_backend());
  for (int64_t n : {2, 3, 4, 5}) {
    Tensor x = randn({n, 8});
    EXPECT_TRUE(allclose(c({x})[0], f.eager(x), 1e-6, 1e-7));
  }
  EXPECT_EQ(c.stats().recompiles, 1);
  EXPECT_EQ(c.stats().specializations, 2);
}

TEST(Guards, DynamicTrueNeverRecompilesForNewSizes) {
  Fixture f;
  CompileOptions o = eager_backend();
  o.dynamic = DynamicMode::True;
  CompiledFunction c = compile(f.fn, o);
  for (int64_t n : {2, 3, 4, 5}) c({randn({n, 8})});
  EXPECT_EQ(c.stats().recompiles, 0);
  EXPECT_EQ(c.stats().specializations, 3);
  EXPECT_NE(c.stats().last_graph.find("sym s0"), std::string::npos) << c.stats().last_graph;
}

TEST(Guards, MarkDynamicHonoursItsBounds) {
  Fixture f;
  CompileOptions o = eager_backend();
  CompiledFunction c = compile(f.fn, o);
  Tensor x = randn({4, 8});
  mark_dynamic(x, 0, 2, 6);
  c({x});
  c({randn({6, 8})});  // inside [2, 6]: no recompile
  EXPECT_EQ(c.stats().recompiles, 0);
  c({randn({7, 8})});  // outside: a recompile naming the dim
  ASSERT_EQ(c.stats().recompiles, 1);
  EXPECT_NE(c.stats().recompile_reasons[0].find("arg0 dim 0 changed from 6 to 7"), std::string::npos)
      << c.stats().recompile_reasons[0];
}

TEST(Guards, MarkDynamicRejectsASizeOutsideItsOwnBounds) {
  Tensor x = randn({4, 8});
  EXPECT_THROW(mark_dynamic(x, 0, 5, 9), Error);
  EXPECT_THROW(mark_dynamic(x, 0, 9, 5), Error);
  EXPECT_THROW(mark_dynamic(x, 3), Error);
}

TEST(Guards, PastTheRecompileLimitTheFunctionRunsEagerly) {
  Fixture f;
  CompileOptions o = eager_backend();
  o.dynamic = DynamicMode::False;
  o.recompile_limit = 2;
  CompiledFunction c = compile(f.fn, o);
  for (int64_t n : {2, 3, 4, 5, 6}) {
    Tensor x = randn({n, 8});
    EXPECT_TRUE(allclose(c({x})[0], f.eager(x), 1e-6, 1e-7));
  }
  EXPECT_EQ(c.stats().recompiles, 2);
  EXPECT_EQ(c.stats().eager_calls, 2);
}

TEST(Guards, ErrorOnRecompileThrowsTheReason) {
  Fixture f;
  CompileOptions o = eager_backend();
  o.error_on_recompile = true;
  o.dynamic = DynamicMode::False;
  CompiledFunction c = compile(f.fn, o);
  c({randn({3, 8})});
  try {
    c({randn({5, 8})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("arg0 dim 0 changed from 3 to 5"), std::string::npos) << e.what();
  }
}

TEST(Stances, ForceEagerAndFailOnRecompileChangeWithoutRewrapping) {
  Fixture f;
  CompileOptions o = eager_backend();
  o.dynamic = DynamicMode::False;
  CompiledFunction c = compile(f.fn, o);
  c({randn({3, 8})});
  c.set_stance(Stance::ForceEager);
  c({randn({3, 8})});
  EXPECT_EQ(c.stats().eager_calls, 1);
  EXPECT_EQ(f.calls, 2);
  c.set_stance(Stance::FailOnRecompile);
  c({randn({3, 8})});  // guards pass: fine
  EXPECT_THROW(c({randn({4, 8})}), Error);
  c.set_stance(Stance::EagerOnRecompile);
  Tensor x = randn({4, 8});
  EXPECT_TRUE(allclose(c({x})[0], f.eager(x), 1e-6, 1e-7));
  EXPECT_EQ(c.stats().recompiles, 0);
  c.set_stance(Stance::Default);
  c({x});
  EXPECT_EQ(c.stats().recompiles, 1);
}

TEST(Stances, EagerThenCompileRunsTheFirstCallEagerly) {
  Fixture f;
  CompileOptions o = eager_backend();
  o.stance = Stance::EagerThenCompile;
  CompiledFunction c = compile(f.fn, o);
  c({randn({3, 8})});
  EXPECT_EQ(c.stats().compiles, 0);
  EXPECT_EQ(c.stats().eager_calls, 1);
  c({randn({3, 8})});
  c({randn({3, 8})});
  EXPECT_EQ(c.stats().compiles, 1);
  EXPECT_EQ(c.stats().compiled_calls, 1);
}

TEST(Guards, DisableRunsEagerlyAndNeverTraces) {
  Fixture f;
  CompileOptions o = eager_backend();
  o.disable = true;
  CompiledFunction c = compile(f.fn, o);
  c({randn({3, 8})});
  c({randn({3, 8})});
  EXPECT_EQ(f.calls, 2);
  EXPECT_EQ(c.stats().compiles, 0);
}

TEST(Guards, BadOptionsAreRejected) {
  Fixture f;
  CompileOptions o;
  o.memory_budget = 0;
  EXPECT_THROW(compile(f.fn, o), Error);
  o.memory_budget = 1;
  o.recompile_limit = -1;
  EXPECT_THROW(compile(f.fn, o), Error);
  EXPECT_THROW(compile(nullptr), Error);
}

}  // namespace
}  // namespace ingot
