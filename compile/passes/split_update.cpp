// Splitting the optimizer update under a memory budget. Eagerly (and after horizontal fusion) every
// gradient of the step is alive at once, waiting for the one multi-tensor update at the end; that is the
// peak of a training step whose activations are small. With budget < 1 this pass replaces each multi-tensor
// update (AdamW's, AdamW8bit's: SplittableUpdate, autograd/primitive_multi_tensor.h) by one update per parameter, placed right after the last node that produces its gradient or
// reads its parameter, so each gradient dies as soon as it is complete and the parameter is updated in place
// (the executor's in-place rule, compile/exec/kernel_step.cpp, holds because nothing reads it afterwards).
// Invariant: split_update.h.
#include "compile/passes/split_update.h"

#include <algorithm>

#include "autograd/primitive_multi_tensor.h"

namespace ingot::compiler::passes {

bool split_update(Graph& g, const SplitUpdateOptions& o) {
  if (o.budget >= 1.0) return false;
  std::vector<int32_t> last_reader(g.values.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (int32_t v : g.nodes[i].inputs)
      if (v >= 0) last_reader[static_cast<size_t>(v)] = static_cast<int32_t>(i);
  std::vector<std::pair<int32_t, Node>> inserts;  // (insert after node index, node)
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const SplittableUpdate* update = as_splittable_update(*n.prim);
    const size_t count = update ? update->tensors() : 0;
    if (count < 2) continue;
    drop[i] = true;
    for (size_t t = 0; t < count; ++t) {
      Node u;
      u.prim = update->for_tensors(1);
      u.loc = n.loc;
      u.inputs = {n.inputs[0]};
      int32_t after = -1;
      for (size_t s = 0; s < update->input_slots(); ++s) {
        const int32_t v = n.inputs[1 + s * count + t];
        u.inputs.push_back(v);
        const int32_t p = g.values[static_cast<size_t>(v)].producer;
        if (p >= 0) after = std::max(after, p);
        // Other readers of the parameter or state (the forward and backward read the parameter).
        for (size_t r = 0; r < g.nodes.size(); ++r)
          if (r != i)
            for (int32_t in : g.nodes[r].inputs)
              if (in == v) after = std::max(after, static_cast<int32_t>(r));
      }
      for (size_t k = 0; k < update->shared_inputs(); ++k)
        u.inputs.push_back(n.inputs[1 + update->input_slots() * count + k]);
      for (size_t s = 0; s < update->output_slots(); ++s) u.outputs.push_back(n.outputs[s * count + t]);
      inserts.emplace_back(after, std::move(u));
    }
  }
  if (inserts.empty()) return false;
  std::stable_sort(inserts.begin(), inserts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Node> nodes;
  size_t k = 0;
  while (k < inserts.size() && inserts[k].first < 0) nodes.push_back(std::move(inserts[k++].second));
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!drop[i]) nodes.push_back(std::move(g.nodes[i]));
    while (k < inserts.size() && inserts[k].first == static_cast<int32_t>(i)) nodes.push_back(std::move(inserts[k++].second));
  }
  g.nodes = std::move(nodes);
  g.renumber_nodes();
  return true;
}

}  // namespace ingot::compiler::passes
