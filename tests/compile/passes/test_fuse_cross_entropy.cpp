// Note [Cross-entropy fused with its backward] (compile/passes/fuse_cross_entropy.cpp): in a traced training step
// the cross_entropy node and its cross_entropy_bwd become one cross_entropy_fused node, the step still matches
// eager, and the gradient still takes the logits' buffer; a loss whose own value feeds its gradient (loss * loss)
// keeps the pair. The kernel's CPU version runs here, the CUDA one in tests/gpu/test_cuda_cross_entropy_fused.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "compile/exec/executor.h"
#include "compile/graph_checks.h"
#include "compile/passes/passes.h"
#include "compile/pipeline.h"
#include "compile/step_fixture.h"
#include "compile/trace/trace.h"
#include "runtime/allocator.h"

namespace ingot::compiler {
namespace {

void expect_only_fused(const Graph& g) {
  EXPECT_EQ(count_nodes(g, "cross_entropy_fused"), 1);
  EXPECT_EQ(count_nodes(g, "cross_entropy"), 0);
  EXPECT_EQ(count_nodes(g, "cross_entropy_bwd"), 0);
}

TEST(FuseCrossEntropy, GptStepHasOneFusedNodeAndMatchesEager) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    manual_seed(23);
    auto model = testing::tiny_gpt2();
    if (bf16) model->set_compute_dtype(DType::bf16);
    auto fn = testing::loss_and_grads(model);
    Graph g = trace(fn, {ids, tgt}).graph;
    ASSERT_EQ(count_nodes(g, "cross_entropy"), 1);
    ASSERT_EQ(count_nodes(g, "cross_entropy_bwd"), 1);
    ASSERT_TRUE(passes::fuse_cross_entropy(g, {}));
    g.verify();
    expect_only_fused(g);
    EXPECT_FALSE(passes::fuse_cross_entropy(g, {})) << "nothing left to fuse";

    CompileStats stats;
    std::shared_ptr<Executable> exe = build_executable(trace(fn, {ids, tgt}).graph, {}, stats);
    expect_only_fused(exe->graph);
    const std::vector<Tensor> got = execute(*exe, {ids, tgt}), want = fn({ids, tgt});
    ASSERT_EQ(got.size(), want.size());
    const double rtol = bf16 ? 2e-2 : 1e-4, atol = bf16 ? 2e-3 : 1e-5;
    EXPECT_NEAR(got[0].item(), want[0].item(), 1e-5 * std::abs(want[0].item()));
    for (size_t i = 1; i < want.size(); ++i)
      EXPECT_LE(max_rel_error(got[i], want[i], rtol, atol), 1.0) << "parameter " << i - 1;
  }
}

TEST(FuseCrossEntropy, IgnoredTargetsAndLabelSmoothingMatchEagerForEveryReduction) {
  manual_seed(24);
  const int64_t n = 12, vocab = 50, d = 6;
  Tensor w = randn({vocab, d}).set_requires_grad(true);
  Tensor x = randn({n, d});
  std::vector<int64_t> tv;
  for (double v : randint(0, vocab, {n}).to_vector()) tv.push_back(static_cast<int64_t>(v));
  tv[2] = tv[7] = -1;
  const Tensor t = from_vector_i64(tv, {n});
  for (Reduction red : {Reduction::Mean, Reduction::Sum}) {
    for (double ls : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(red == Reduction::Mean ? "mean" : "sum") + " label_smoothing " + std::to_string(ls));
      auto step = [&](const std::vector<Tensor>& a) {
        Tensor loss = cross_entropy(linear(a[0], w, Tensor()), a[1], -1, ls, red);
        loss.backward();
        Tensor gw = w.grad();
        w.zero_grad();
        return std::vector<Tensor>{loss, gw};
      };
      CompileStats stats;
      std::shared_ptr<Executable> exe = build_executable(trace(step, {x, t}).graph, {}, stats);
      expect_only_fused(exe->graph);
      const std::vector<Tensor> got = execute(*exe, {x, t}), want = step({x, t});
      EXPECT_NEAR(got[0].item(), want[0].item(), 1e-6 * std::abs(want[0].item()));
      EXPECT_LE(max_rel_error(got[1], want[1], 1e-5, 1e-6), 1.0);
    }
  }
}

TEST(FuseCrossEntropy, ALossThatFeedsItsOwnGradientIsNotFused) {
  manual_seed(25);
  Tensor w = randn({40, 6}).set_requires_grad(true);
  Tensor x = randn({10, 6}), t = randint(0, 40, {10});
  auto step = [&](const std::vector<Tensor>& a) {
    Tensor loss = cross_entropy(linear(a[0], w, Tensor()), a[1]);
    Tensor squared = mul(loss, loss);  // d(squared)/d(loss) = 2 * loss: dloss reads the forward's output
    squared.backward();
    Tensor gw = w.grad();
    w.zero_grad();
    return std::vector<Tensor>{squared, gw};
  };
  Graph g = trace(step, {x, t}).graph;
  ASSERT_EQ(count_nodes(g, "cross_entropy"), 1);
  EXPECT_FALSE(passes::fuse_cross_entropy(g, {}));
  EXPECT_EQ(count_nodes(g, "cross_entropy_fused"), 0);
  CompileStats stats;
  std::shared_ptr<Executable> exe = build_executable(trace(step, {x, t}).graph, {}, stats);
  EXPECT_EQ(count_nodes(exe->graph, "cross_entropy"), 1);
  EXPECT_EQ(count_nodes(exe->graph, "cross_entropy_bwd"), 1);
  EXPECT_EQ(count_nodes(exe->graph, "cross_entropy_fused"), 0);
  const std::vector<Tensor> got = execute(*exe, {x, t}), want = step({x, t});
  EXPECT_NEAR(got[0].item(), want[0].item(), 1e-6 * std::abs(want[0].item()));
  EXPECT_LE(max_rel_error(got[1], want[1], 1e-5, 1e-6), 1.0);
}

// Note [Outputs over dead inputs]: the fused node's gradient is written over the logits as the backward's was.
TEST(FuseCrossEntropy, TheGradientStillTakesTheLogitsBuffer) {
  const int64_t n = 64, vocab = 16384, d = 8;
  testing::LinearHeadStep step = testing::linear_head_step(26, n, vocab, d);
  const Tensor x = step.x, t = step.t;
  CompiledFunction compiled = compile(step);
  compiled({x, t});  // traces and compiles
  ASSERT_NE(compiled.stats().last_graph.find("cross_entropy_fused"), std::string::npos) << compiled.stats().last_graph;
  cpu_allocator().reset_peak();
  const std::vector<Tensor> got = compiled({x, t});
  const int64_t peak = cpu_allocator().stats().peak_allocated_bytes, logits_bytes = n * vocab * 4;
  std::printf("[ memory   ] compiled peak %lld bytes (logits %lld)\n", static_cast<long long>(peak),
              static_cast<long long>(logits_bytes));
  EXPECT_LT(peak, 2 * logits_bytes);
  const std::vector<Tensor> want = step({x, t});
  EXPECT_NEAR(got[0].item(), want[0].item(), 1e-6 * std::abs(want[0].item()));
  EXPECT_LE(max_rel_error(got[1], want[1], 1e-5, 1e-6), 1.0);
}

}  // namespace
}  // namespace ingot::compiler
