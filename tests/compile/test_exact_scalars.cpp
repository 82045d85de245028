// Scalar attributes past 6 significant digits (Note [Exact attributes], autograd/primitive.h): the simplify
// pass, CSE, the graph hash, kernel reuse across functions and the rendered kernel constants all see the
// exact double. They used to see the stream's 6-digit text: x * 1.0000001 was taken for the identity, and
// x * 0.5000001 was merged with x * 0.5000002.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/ops.h"
#include "compile/api.h"
#include "compile/trace/trace.h"
#include "runtime/file_util.h"
#include "tests/testing.h"

namespace ingot {
namespace {

// The second call runs the compiled graph (the first traces and runs eagerly).
std::vector<Tensor> run_compiled(CompiledFunction::Fn fn, const std::vector<Tensor>& args, CompileOptions o = {}) {
  o.backend = CompileBackend::Cpu;
  CompiledFunction f = compile(std::move(fn), o);
  f(args);
  std::vector<Tensor> out = f(args);
  EXPECT_EQ(f.stats().compiled_calls, 1);
  return out;
}

// Same values, bit for bit (the tensors hold no NaN).
::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = a.to_vector(), vb = b.to_vector();
  if (va.size() != vb.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < va.size(); ++i)
    if (va[i] != vb[i] || std::signbit(va[i]) != std::signbit(vb[i]))
      return ::testing::AssertionFailure() << "element " << i << ": " << va[i] << " vs " << vb[i] << " (diff "
                                           << va[i] - vb[i] << ")";
  return ::testing::AssertionSuccess();
}

TEST(CompileExactScalars, MulByOnePlusTenToTheMinusSevenIsNoIdentity) {
  auto fn = [](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] * 1.0000001}; };
  Tensor x = randn({4, 33}, DType::f64);
  const Tensor eager = fn({x})[0];
  const Tensor y = run_compiled(fn, {x})[0];
  EXPECT_TRUE(same_bits(y, eager));
  EXPECT_FALSE(same_bits(y, x)) << "the multiply was dropped as an identity";
  // And add_scalar of a tiny non-zero value is no identity either.
  auto add_fn = [](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] + 1e-7}; };
  EXPECT_TRUE(same_bits(run_compiled(add_fn, {x})[0], add_fn({x})[0]));
}

TEST(CompileExactScalars, CseKeepsScalarsThatDifferPastSixDigits) {
  auto fn = [](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] * 0.5000001 + a[0] * 0.5000002}; };
  Tensor x = randn({4, 33}, DType::f64);
  const Tensor eager = fn({x})[0];
  const Tensor y = run_compiled(fn, {x})[0];
  // The fused kernel may contract a multiply-add: within a few ulps, far from the merged a * 0.5000001 * 2.
  EXPECT_LE(max_rel_error(y, eager, 1e-14, 0), 1.0);
  EXPECT_GT(max_rel_error(y, x * 0.5000001 * 2.0, 1e-9, 0), 1.0) << "x * 0.5000002 was merged into x * 0.5000001";
}

TEST(CompileExactScalars, GraphHashAndEquivalenceSeeTheExactScalar) {
  auto g = [](double s) {
    return [s](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] * s}; };
  };
  Tensor x = randn({3}, DType::f64);
  compiler::TraceResult a = compiler::trace(g(0.5000001), {x});
  compiler::TraceResult b = compiler::trace(g(0.5000002), {x});
  compiler::TraceResult c = compiler::trace(g(0.5000001), {x});
  ASSERT_EQ(a.graph.nodes.size(), 1u);
  EXPECT_NE(a.graph.structural_hash(), b.graph.structural_hash());
  EXPECT_EQ(a.graph.structural_hash(), c.graph.structural_hash());
  EXPECT_FALSE(a.graph.nodes[0].prim->equivalent(*b.graph.nodes[0].prim));
  EXPECT_TRUE(a.graph.nodes[0].prim->equivalent(*c.graph.nodes[0].prim));
  EXPECT_EQ(exact_attrs(*a.graph.nodes[0].prim), "alpha=0.50000009999999995");
}

TEST(CompileExactScalars, FunctionsDifferingPastSixDigitsSharingACacheGetTheirOwnKernels) {
  TempDir dir("ingot-exact-scalars-");
  CompileOptions o;
  o.cache_dir = dir.path();
  auto f = [](double s) {
    return [s](const std::vector<Tensor>& a) { return std::vector<Tensor>{exp(a[0] * s) + a[1] * s}; };
  };
  Tensor x = randn({5, 17}, DType::f64), w = randn({5, 17}, DType::f64);
  for (double s : {1.0000001, 1.0000002, 1.0000001, 0.30000001, 0.30000002}) {
    SCOPED_TRACE(s);
    const Tensor eager = f(s)({x, w})[0];
    // Vectorized exp may differ from eager's by ulps; a constant taken for another is off by ~1e-7.
    EXPECT_LE(max_rel_error(run_compiled(f(s), {x, w}, o)[0], eager, 1e-12, 1e-300), 1.0);
  }
}

// Kernel constants are written exactly: a double at all its digits and, in a float kernel, the value rounded
// once to float as the eager kernels do (1 + 2^-24 is a tie: it rounds to 1; the decimal literal
// 1.0000000596046448f rounded to 1 + 2^-23).
TEST(CodegenCpuConstants, ConstantsMatchEagerBitForBit) {
  Tensor x = randn({7, 9}, DType::f64);
  const double c = 0.1 + 1e-9;
  auto f64_fn = [c](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] * c, a[0] + c, a[0] - c}; };
  const std::vector<Tensor> e64 = f64_fn({x}), c64 = run_compiled(f64_fn, {x});
  for (size_t i = 0; i < e64.size(); ++i) EXPECT_TRUE(same_bits(c64[i], e64[i])) << "output " << i;

  Tensor z = from_vector({0.0, 1.0, -2.0, 0.5, 3.0, -0.25}, {2, 3}, DType::f32);
  const double tie = 1.0 + std::ldexp(1.0, -24);
  auto f32_fn = [tie](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] + tie, a[0] * 3.0000001}; };
  const std::vector<Tensor> e32 = f32_fn({z}), c32 = run_compiled(f32_fn, {z});
  for (size_t i = 0; i < e32.size(); ++i) EXPECT_TRUE(same_bits(c32[i], e32[i])) << "output " << i;
}

// The CUDA renderer writes constants the same way (hex floats rounded once to the compute type).
TEST(CodegenCudaConstants, ConstantsMatchEagerBitForBitOnTheGpu) {
  INGOT_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  auto run_gpu = [](CompiledFunction::Fn fn, const std::vector<Tensor>& args) {
    CompileOptions o;
    o.backend = CompileBackend::Cuda;
    CompiledFunction f = compile(std::move(fn), o);
    f(args);
    std::vector<Tensor> out = f(args);
    EXPECT_EQ(f.stats().compiled_calls, 1);
    EXPECT_GT(f.stats().kernels, 0);
    return out;
  };
  Tensor x = randn({7, 9}, DType::f64).to(gpu);
  const double c = 0.1 + 1e-9;
  auto f64_fn = [c](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{-(a[0] * c), -(a[0] + c), -(a[0] - c)};
  };
  const std::vector<Tensor> e64 = f64_fn({x}), c64 = run_gpu(f64_fn, {x});
  for (size_t i = 0; i < e64.size(); ++i) EXPECT_TRUE(same_bits(c64[i], e64[i])) << "output " << i;

  Tensor z = from_vector({0.0, 1.0, -2.0, 0.5, 3.0, -0.25}, {2, 3}, DType::f32).to(gpu);
  const double tie = 1.0 + std::ldexp(1.0, -24);
  auto f32_fn = [tie](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{-(a[0] + tie), -(a[0] * 3.0000001)};
  };
  const std::vector<Tensor> e32 = f32_fn({z}), c32 = run_gpu(f32_fn, {z});
  for (size_t i = 0; i < e32.size(); ++i) EXPECT_TRUE(same_bits(c32[i], e32[i])) << "output " << i;
}

}  // namespace
}  // namespace ingot
