// explain: what the compiler did with a function, as a report a person reads (torch._dynamo.explain's role).
//
//   std::string report = ingot::explain(step_fn, {ids, targets});
//
// compiles `fn` with `opts` and calls it once on `args` (so it runs one real step: the optimizer updates
// the parameters), then reports: graphs and graph breaks (reason and the user's source line), ops before and
// after the passes, fusion groups and kernels (generated / reused), executor launches, recompiles with
// reasons, planned peak memory, and compile time by phase. `ingot explain CONFIG` builds the recipe's step
// function and prints this report.
#pragma once

#include <string>
#include <vector>

#include "compile/api.h"

namespace ingot {

std::string explain(const CompiledFunction::Fn& fn, const std::vector<Tensor>& args, CompileOptions opts = {});
// The same report for a compiled function that has already run (the run summary's "compile" section).
std::string explain_report(const CompiledFunction& f);

namespace compiler {
class Graph;
// Note [Collectives in explain] (explain.cpp): one line per collective start of a scheduled graph, in order.
std::vector<std::string> describe_collectives(const Graph& g);
}  // namespace compiler

}  // namespace ingot
