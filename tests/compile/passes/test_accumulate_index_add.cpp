// compile/passes/accumulate_index_add.cpp: GPT-2's tied embedding gradient is scattered into the head's weight
// gradient (no zero-filled [vocab, C] buffer, no add), and the step still matches eager.
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

TEST(AccumulateIndexAdd, TiedEmbeddingGradientScattersIntoTheHeadGradient) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  for (bool bf16 : {false, true}) {
    manual_seed(19);
    auto model = testing::tiny_gpt2();
    if (bf16) model->set_compute_dtype(DType::bf16);
    auto fn = testing::loss_and_grads(model);
    Graph g = trace(fn, {ids, tgt}).graph;
    const int index_adds = count_nodes(g, "index_add");
    ASSERT_EQ(index_adds, 2) << "token and position embeddings";
    ASSERT_TRUE(passes::accumulate_index_add(g, {}));
    passes::dce(g, {});
    g.verify();
    // Only the tied token embedding has a second gradient to add to; the position embedding keeps its zeros.
    EXPECT_EQ(count_nodes(g, "index_add_accumulate"), 1);
    EXPECT_EQ(count_nodes(g, "index_add"), 1);
    expect_graph_matches_eager(std::move(g), fn, {ids, tgt}, 1e-6, bf16 ? 1e-2 : 1e-5, bf16 ? 1e-3 : 1e-6,
                               bf16 ? "bf16" : "f32");
  }
}

TEST(AccumulateIndexAdd, AScatteredValueReadElsewhereStays) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  manual_seed(19);
  auto fn = testing::loss_and_grads(testing::tiny_gpt2());
  Graph g = trace(fn, {ids, tgt}).graph;
  for (const Node& n : g.nodes)
    if (n.prim->name() == "index_add") g.outputs.push_back(n.outputs[0]);
  EXPECT_FALSE(passes::accumulate_index_add(g, {}));
}

}  // namespace
}  // namespace ingot::compiler
