// Graph breaks: item() on traced values, data-dependent branches, ops with no lowering (compile/trace/trace.h).
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "compile/api.h"
#include "compile/explain.h"
#include "runtime/rng.h"

namespace ingot {
namespace {

int g_branch_line = 0;

// Branches on the data: doubles x when its sum is positive, else negates it.
std::vector<Tensor> branchy(const std::vector<Tensor>& a) {
  Tensor s = sum(a[0]);
  g_branch_line = __LINE__ + 1;
  if (s.item() > 0) return {a[0] * 2.0};
  return {neg(a[0])};
}

CompileOptions no_codegen(CompileOptions o = {}) {
  o.backend = CompileBackend::Eager;
  return o;
}

TEST(GraphBreaks, FullgraphRejectsItemNamingTheUsersSourceLine) {
  CompileOptions o = no_codegen();
  o.fullgraph = true;
  CompiledFunction c = compile(branchy, o);
  try {
    c({full({3}, 1.0)});
    FAIL() << "expected a fullgraph error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fullgraph: graph break at test_graph_breaks.cpp:" + std::to_string(g_branch_line)),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("read on the host"), std::string::npos) << msg;
  }
}

TEST(GraphBreaks, WithoutFullgraphTheFunctionContinuesAndGivesEagerResults) {
  CompiledFunction c = compile(branchy, no_codegen());
  for (double v : {1.0, -1.0, 2.0, -3.0}) {
    Tensor x = from_vector({v, 0.5, 0.25}, {3});
    Tensor want = v + 0.75 > 0 ? x * 2.0 : neg(x);
    EXPECT_TRUE(allclose(c({x})[0], want)) << "input " << v;
  }
  ASSERT_EQ(c.stats().graph_breaks.size(), 1u);
  EXPECT_NE(c.stats().graph_breaks[0].find("test_graph_breaks.cpp:" + std::to_string(g_branch_line)),
            std::string::npos) << c.stats().graph_breaks[0];
  const std::string report = explain_report(c);
  EXPECT_NE(report.find("graph breaks: 1"), std::string::npos) << report;
  EXPECT_NE(report.find("split there"), std::string::npos) << report;
  EXPECT_EQ(c.stats().graphs, 2);
  EXPECT_EQ(c.stats().compiled_calls, 3);
}

// Dropout's (seed, offset) is a host input of the graph (Note [Replayable dropout]): no break, a fresh mask at
// every call, and the same masks, in the same order, as eager calls from the same generator state.
TEST(GraphBreaks, DropoutCompilesWithoutABreakAndDrawsEagersMasks) {
  auto fn = [](const std::vector<Tensor>& a) { return std::vector<Tensor>{dropout(a[0], 0.5, true)}; };
  const Tensor x = add(rand({64}), 0.5);
  manual_seed(41);
  std::vector<std::vector<double>> eager;
  for (int i = 0; i < 3; ++i) eager.push_back(fn({x})[0].to_vector());
  const uint64_t eager_offset = default_generator(Device::cpu()).offset();
  manual_seed(41);
  CompiledFunction c = compile(fn);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c({x})[0].to_vector(), eager[static_cast<size_t>(i)]) << "call " << i;
  EXPECT_EQ(default_generator(Device::cpu()).offset(), eager_offset) << "compiled calls draw what eager draws";
  EXPECT_NE(eager[1], eager[2]) << "each call draws a fresh mask";
  EXPECT_TRUE(c.stats().graph_breaks.empty());
  EXPECT_EQ(c.stats().compiled_calls, 2);
}

TEST(GraphBreaks, HostReadsOfUntracedTensorsAreNotBreaks) {
  auto fn = [](const std::vector<Tensor>& a) {
    Tensor scale = from_vector({3.0}, {});  // made on the host, never touched by a traced op
    return std::vector<Tensor>{a[0] * scale.item()};
  };
  CompiledFunction c = compile(fn, no_codegen());
  c({randn({4})});
  EXPECT_TRUE(c.stats().graph_breaks.empty());
  Tensor x = randn({4});
  EXPECT_TRUE(allclose(c({x})[0], x * 3.0));
}

TEST(GraphBreaks, ExplainReportsOneGraphForABreakFreeFunction) {
  Tensor w = randn({4, 4});
  const std::string report = explain(
      [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{relu(matmul(a[0], w)) * 2.0}; }, {randn({2, 4})},
      no_codegen());
  EXPECT_NE(report.find("graphs: 1 (the whole step is one graph)"), std::string::npos) << report;
  EXPECT_NE(report.find("graph breaks: 0"), std::string::npos) << report;
  EXPECT_NE(report.find("compile time: trace"), std::string::npos) << report;
}

}  // namespace
}  // namespace ingot
