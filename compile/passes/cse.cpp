// Common-subexpression elimination (invariant: cse.h). Sound because nodes are pure; ops with hidden state are
// not equivalent (dropout's seed/offset are attributes). Recomputed nodes merge only among themselves (Note
// [Recomputed nodes], compile/ir/graph.h).
#include "compile/passes/cse.h"

#include <map>
#include <sstream>

namespace ingot::compiler::passes {

bool cse(Graph& g, const CseOptions&) {
  std::map<std::string, std::vector<int32_t>> seen;  // name|inputs -> earlier nodes
  std::vector<bool> drop(g.nodes.size(), false);
  bool changed = false;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    Node& node = g.nodes[n];
    std::ostringstream key;
    key << node.prim->name() << "|" << exact_attrs(*node.prim) << (node.recomputed ? "|recomputed" : "");
    for (int32_t i : node.inputs) key << "|" << i;
    auto& cands = seen[key.str()];
    bool merged = false;
    for (int32_t m : cands) {
      const Node& other = g.nodes[static_cast<size_t>(m)];
      if (!other.prim->equivalent(*node.prim) || other.outputs.size() != node.outputs.size()) continue;
      for (size_t k = 0; k < node.outputs.size(); ++k) g.replace_uses(node.outputs[k], other.outputs[k]);
      drop[n] = merged = changed = true;
      break;
    }
    if (!merged) cands.push_back(static_cast<int32_t>(n));
  }
  if (!changed) return false;
  std::vector<Node> kept;
  for (size_t n = 0; n < g.nodes.size(); ++n)
    if (!drop[n]) kept.push_back(std::move(g.nodes[n]));
  g.nodes = std::move(kept);
  g.renumber_nodes();
  return true;
}

}  // namespace ingot::compiler::passes
