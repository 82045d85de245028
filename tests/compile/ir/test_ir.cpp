// The graph IR: building, printing, verifying, hashing (compile/ir).
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "compile/ir/graph.h"
#include "compile/trace/trace.h"

namespace ingot::compiler {
namespace {

// A graph of relu(x * w + b) built by tracing the eager ops, so the primitives are the real ones.
Graph traced_graph() {
  Tensor w = randn({4, 3}).set_name("w");
  Tensor b = randn({3}).set_name("b");
  TraceResult r = trace([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{relu(a[0] * w + b)}; },
                        {randn({4, 3})});
  return std::move(r.graph);
}

TEST(GraphIr, TracedGraphVerifiesAndPrintsEveryOpWithItsCallSite) {
  Graph g = traced_graph();
  g.verify();
  ASSERT_EQ(g.nodes.size(), 3u);
  const std::string s = g.str();
  EXPECT_NE(s.find("= mul(%0, %1)"), std::string::npos) << s;
  EXPECT_NE(s.find("relu("), std::string::npos) << s;
  // Ops record the call site apply() sees (the op family's file); item() breaks name the user's line.
  EXPECT_NE(s.find("# pointwise.cpp:"), std::string::npos) << s;
  EXPECT_NE(s.find("f32[4, 3]"), std::string::npos) << s;
  EXPECT_NE(s.find("captured \"w\""), std::string::npos) << s;
}

// Graph::readers, what the passes walk: each node once per value it reads (x * x is one reader of x), in node order.
TEST(GraphIr, ReadersListEachReadingNodeOnceInNodeOrder) {
  TraceResult r = trace(
      [](const std::vector<Tensor>& a) {
        Tensor sq = a[0] * a[0];
        return std::vector<Tensor>{sq + a[0], relu(sq)};
      },
      {randn({2, 3})});
  const Graph& g = r.graph;
  ASSERT_EQ(g.nodes.size(), 3u);
  const int32_t x = g.nodes[0].inputs[0], sq = g.nodes[0].outputs[0];
  const std::vector<std::vector<int32_t>> readers = g.readers();
  ASSERT_EQ(readers.size(), g.values.size());
  EXPECT_EQ(readers[static_cast<size_t>(x)], (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(readers[static_cast<size_t>(sq)], (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(readers[static_cast<size_t>(g.nodes[2].outputs[0])].empty());
}

TEST(GraphIr, VerifyRejectsANodeReadingALaterValue) {
  Graph g = traced_graph();
  std::swap(g.nodes[0], g.nodes[1]);
  g.nodes[0].id = 0;
  g.nodes[1].id = 1;
  for (size_t n = 0; n < 2; ++n)
    for (int32_t v : g.nodes[n].outputs) g.values[static_cast<size_t>(v)].producer = static_cast<int32_t>(n);
  try {
    g.verify();
    FAIL() << "expected a verify error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("before it is defined"), std::string::npos) << e.what();
  }
}

TEST(GraphIr, VerifyRejectsOutputMetadataThatDisagreesWithInfer) {
  Graph g = traced_graph();
  g.values[static_cast<size_t>(g.nodes[0].outputs[0])].dtype = DType::f64;
  EXPECT_THROW(g.verify(), Error);
}

TEST(GraphIr, VerifyRejectsAWriteBackIntoAnArg) {
  Graph g = traced_graph();
  g.writebacks.push_back(WriteBack{0, g.outputs[0]});
  try {
    g.verify();
    FAIL() << "expected a verify error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a captured tensor"), std::string::npos) << e.what();
  }
}

TEST(GraphIr, StructuralHashIgnoresValuesButNotOps) {
  Graph a = traced_graph(), b = traced_graph();
  EXPECT_EQ(a.structural_hash(), b.structural_hash());
  Tensor w = randn({4, 3});
  TraceResult r = trace([&](const std::vector<Tensor>& x) { return std::vector<Tensor>{gelu(x[0] * w)}; },
                        {randn({4, 3})});
  EXPECT_NE(a.structural_hash(), r.graph.structural_hash());
}

TEST(GraphIr, SymbolicDimsPrintByName) {
  Graph g = traced_graph();
  g.symbols.push_back(Symbol{"s0", 2, 64});
  g.values[0].shape[0].sym = 0;
  const std::string s = g.str();
  EXPECT_NE(s.find("f32[s0, 3]"), std::string::npos) << s;
  EXPECT_NE(s.find("sym s0 in [2, 64]"), std::string::npos) << s;
}

}  // namespace
}  // namespace ingot::compiler
