// unit_reductions: see unit_reductions.h (Note [Unit reductions are waited for a unit later]).
#include "compile/passes/unit_reductions.h"

#include "autograd/ops/attrs.h"
#include "autograd/primitive_collective.h"

namespace ingot::compiler::passes {
namespace {

bool is_unit_reduction(const Primitive& p) {
  return is_start_of(p, CollectiveOp::ReduceScatter) && match<UnitCollectiveAttrs>(p) != nullptr;
}

}  // namespace

bool unit_reductions(Graph& g, const UnitReductionsOptions& o) {
  if (o.lag < 1) return false;
  const size_t lag = static_cast<size_t>(o.lag);
  std::vector<int32_t> starts;
  // wait_of[value]: the wait whose pending buffer (first input) is the value. A wait reading it as a token
  // (a second input) is another unit's.
  std::vector<int32_t> wait_of(g.values.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (is_unit_reduction(*n.prim)) starts.push_back(static_cast<int32_t>(i));
    if (is_collective_wait(*n.prim) && !n.inputs.empty() && n.inputs[0] >= 0)
      wait_of[static_cast<size_t>(n.inputs[0])] = static_cast<int32_t>(i);
  }
  bool changed = false;
  for (size_t i = 0; i + lag < starts.size(); ++i) {
    const int32_t w = wait_of[static_cast<size_t>(g.nodes[static_cast<size_t>(starts[i])].outputs[0])];
    const int32_t later = starts[i + lag];
    if (w < 0 || later > w) continue;
    g.nodes[static_cast<size_t>(w)].inputs.push_back(g.nodes[static_cast<size_t>(later)].outputs[0]);
    changed = true;
  }
  return changed;
}

}  // namespace ingot::compiler::passes
