// Note [Sibling fusion] (compile/passes/fuse.cpp): under a memory budget the GELU output is recomputed in the
// backward (remat.cpp); it must share one kernel with the GELU gradient (both read the first MLP projection's
// output), and the step must still match eager. Without the budget nothing is recomputed and no forward op
// joins a backward kernel.
#include <gtest/gtest.h>

#include <cmath>

#include "compile/exec/executor.h"
#include "compile/pipeline.h"
#include "compile/step_fixture.h"
#include "compile/trace/trace.h"

namespace ingot::compiler {
namespace {

struct GeluGroups {
  int grad_groups = 0;             // groups holding a gelu_tanh_grad
  int with_recomputed_gelu = 0;    // ... that also hold a (backward) gelu_tanh
  int mixed_forward_backward = 0;  // groups with forward and backward members
};

GeluGroups inspect(const Graph& g) {
  GeluGroups r;
  for (const FusionGroup& fg : g.groups) {
    bool grad = false, gelu = false, fwd = false, bwd = false;
    for (int32_t m : fg.nodes) {
      const Node& n = g.nodes[static_cast<size_t>(m)];
      grad = grad || n.prim->name() == "gelu_tanh_grad";
      gelu = gelu || (n.prim->name() == "gelu_tanh" && !n.forward);
      (n.forward ? fwd : bwd) = true;
    }
    r.grad_groups += grad;
    r.with_recomputed_gelu += grad && gelu;
    r.mixed_forward_backward += fwd && bwd;
  }
  return r;
}

TEST(SiblingFusion, RecomputedGeluSharesTheGeluGradientKernel) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  for (double budget : {1.0, 0.8}) {
    manual_seed(11);
    auto model = testing::tiny_gpt2();
    auto fn = testing::loss_and_grads(model);
    CompileOptions o;
    o.memory_budget = budget;
    CompileStats stats;
    std::shared_ptr<Executable> exe = build_executable(std::move(trace(fn, {ids, tgt}).graph), o, stats);
    const GeluGroups gg = inspect(exe->graph);
    const int layers = 2;
    EXPECT_EQ(gg.grad_groups, layers) << "budget " << budget;
    EXPECT_EQ(gg.with_recomputed_gelu, budget < 1 ? layers : 0) << "budget " << budget;
    EXPECT_EQ(gg.mixed_forward_backward, 0) << "budget " << budget;
    const std::vector<Tensor> got = execute(*exe, {ids, tgt}), want = fn({ids, tgt});
    ASSERT_EQ(got.size(), want.size());
    EXPECT_NEAR(got[0].item(), want[0].item(), 1e-5 * std::abs(want[0].item()));
    for (size_t i = 1; i < want.size(); ++i)
      EXPECT_LE(max_rel_error(got[i], want[i], 1e-4, 1e-5), 1.0) << "budget " << budget << " parameter " << i - 1;
  }
}

}  // namespace
}  // namespace ingot::compiler
