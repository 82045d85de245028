// Checks shared by the pass tests: counting a primitive in a graph, and running a rewritten training-step graph
// against the eager step it was traced from.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "compile/exec/executor.h"
#include "compile/pipeline.h"

namespace ingot::compiler {

inline int count_nodes(const Graph& g, std::string_view name) {
  int n = 0;
  for (const Node& node : g.nodes) n += node.prim->name() == name;
  return n;
}

// Builds `g` with default options, runs it on `args` and compares {loss, gradients...} with `eager(args)`: the
// loss to loss_rtol, each gradient to (rtol, atol) in max_rel_error's sense.
template <typename Fn>
void expect_graph_matches_eager(Graph g, const Fn& eager, const std::vector<Tensor>& args, double loss_rtol,
                                double rtol, double atol, const std::string& what) {
  CompileStats stats;
  std::shared_ptr<Executable> exe = build_executable(std::move(g), {}, stats);
  const std::vector<Tensor> got = execute(*exe, args), want = eager(args);
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_NEAR(got[0].item(), want[0].item(), loss_rtol * std::abs(want[0].item())) << what;
  for (size_t i = 1; i < want.size(); ++i)
    EXPECT_LE(max_rel_error(got[i], want[i], rtol, atol), 1.0) << what << " parameter " << i - 1;
}

}  // namespace ingot::compiler
