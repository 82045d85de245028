// compile/passes/pack_attention_grads.cpp: GPT-2's fused qkv projection gets its gradient from one
// attention_bwd_packed node per block instead of attention_bwd + 3 permutes + 3 reshapes + cat, and the step
// still matches eager. The CUDA kernels write into the packed layout in place; every compiled GPT-2 step on the
// GPU (CompileCudaStep.*) runs that path against eager and the CPU.
#include <gtest/gtest.h>

#include <cmath>

#include "compile/exec/executor.h"
#include "compile/graph_checks.h"
#include "compile/passes/passes.h"
#include "compile/pipeline.h"
#include "compile/step_fixture.h"
#include "compile/trace/trace.h"

namespace ingot::compiler {
namespace {

Node* find(Graph& g, std::string_view name) {
  for (Node& n : g.nodes)
    if (n.prim->name() == name) return &n;
  return nullptr;
}

TEST(PackAttentionGrads, QkvGradientIsWrittenByTheAttentionBackward) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  for (bool bf16 : {false, true}) {
    manual_seed(17);
    auto model = testing::tiny_gpt2();
    if (bf16) model->set_compute_dtype(DType::bf16);
    auto fn = testing::loss_and_grads(model);
    Graph g = trace(fn, {ids, tgt}).graph;
    const int layers = 2, cats = count_nodes(g, "cat");
    ASSERT_EQ(count_nodes(g, "attention_bwd"), layers);
    ASSERT_TRUE(passes::pack_attention_grads(g, {}));
    passes::dce(g, {});
    g.verify();
    EXPECT_EQ(count_nodes(g, "attention_bwd"), 0);
    EXPECT_EQ(count_nodes(g, "attention_bwd_packed"), layers);
    EXPECT_EQ(count_nodes(g, "cat"), cats - layers);
    // The attention kernels are the same; the executable's generated kernels round differently from eager's.
    expect_graph_matches_eager(std::move(g), fn, {ids, tgt}, 1e-6, bf16 ? 1e-2 : 1e-5, bf16 ? 1e-3 : 1e-6,
                               bf16 ? "bf16" : "f32");
  }
}

TEST(PackAttentionGrads, LeavesOtherConcatenationsAlone) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  manual_seed(17);
  auto fn = testing::loss_and_grads(testing::tiny_gpt2());
  {  // dk, dq, dv is not the projection's order
    Graph g = trace(fn, {ids, tgt}).graph;
    for (Node& n : g.nodes)
      if (n.prim->name() == "cat" && n.inputs.size() == 3) std::swap(n.inputs[0], n.inputs[1]);
    EXPECT_FALSE(passes::pack_attention_grads(g, {}));
  }
  {  // a piece read by something else still needs its own buffer
    Graph g = trace(fn, {ids, tgt}).graph;
    for (Node& n : g.nodes)
      if (n.prim->name() == "cat" && n.inputs.size() == 3) g.outputs.push_back(n.inputs[2]);
    EXPECT_FALSE(passes::pack_attention_grads(g, {}));
  }
  {  // separate q, k, v projections: nothing to concatenate
    Graph g = trace(testing::loss_and_grads(testing::tiny_llama()), {ids, tgt}).graph;
    ASSERT_NE(find(g, "attention_bwd"), nullptr);
    EXPECT_FALSE(passes::pack_attention_grads(g, {}));
  }
}

}  // namespace
}  // namespace ingot::compiler
