// Dead-code elimination (invariant: dce.h). Nodes are pure (the graph is functional), so a node whose outputs
// nobody reads can go.
#include "compile/passes/dce.h"

namespace ingot::compiler::passes {

bool dce(Graph& g, const DceOptions&) {
  std::vector<bool> live(g.values.size(), false);
  for (int32_t o : g.outputs) live[static_cast<size_t>(o)] = true;
  for (const WriteBack& w : g.writebacks) live[static_cast<size_t>(w.value)] = true;
  for (const GradOut& go : g.grad_outs)
    if (go.value >= 0) live[static_cast<size_t>(go.value)] = true;
  std::vector<bool> keep(g.nodes.size(), false);
  for (size_t n = g.nodes.size(); n-- > 0;) {
    const Node& node = g.nodes[n];
    for (int32_t o : node.outputs) keep[n] = keep[n] || live[static_cast<size_t>(o)];
    if (!keep[n]) continue;
    for (int32_t i : node.inputs)
      if (i >= 0) live[static_cast<size_t>(i)] = true;
  }
  std::vector<Node> kept;
  for (size_t n = 0; n < g.nodes.size(); ++n)
    if (keep[n]) kept.push_back(std::move(g.nodes[n]));
  const bool changed = kept.size() != g.nodes.size();
  g.nodes = std::move(kept);
  if (changed) g.renumber_nodes();
  return changed;
}

}  // namespace ingot::compiler::passes
