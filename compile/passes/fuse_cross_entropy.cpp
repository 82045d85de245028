// Cross-entropy fused with its backward (invariant: fuse_cross_entropy.h).
//
// Note [Cross-entropy fused with its backward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The forward reads the logits once to reduce each row and the backward reads them again to write the
// gradient: for GPT-2 (16 x 1024 tokens, 50304 classes, bf16) two passes over 1.65 GB. In a training step the
// backward's dloss is the seed scaled by the reduction (for Mean, seed / number of counted targets, which
// depends on the targets only), so both can run in one kernel that reduces a row and writes its gradient
// while the row is still in L2. That needs dloss before the forward runs, so the pass fuses only when no path
// leads from the cross_entropy node to dloss (a loss fed back into its own gradient, loss * loss, keeps the
// pair). The fused node takes the backward's place; the forward's dependents traced between the two (the
// loss's sum and division) move after it, which is legal because none of them leads to dloss either.
#include "compile/passes/fuse_cross_entropy.h"

#include "autograd/ops/loss_fused.h"

namespace ingot::compiler::passes {
namespace {

bool same_attrs(const Primitive& a, const Primitive& b) {
  const std::optional<CrossEntropyAttrs> x = cross_entropy_attrs(a), y = cross_entropy_attrs(b);
  return x && y && x->ignore_index == y->ignore_index && x->label_smoothing == y->label_smoothing;
}

// Fuses the first pair it finds; returns false when there is none.
bool fuse_one(Graph& g) {
  auto value = [&](int32_t v) -> const Value& { return g.values[static_cast<size_t>(v)]; };
  for (size_t f = 0; f < g.nodes.size(); ++f) {
    const Node& fwd = g.nodes[f];
    const CrossEntropyAttrs* ce = match<CrossEntropyAttrs>(*fwd.prim);
    if (!ce || ce->backward || fwd.outputs.size() != 2) continue;
    const int32_t logits = fwd.inputs[0], target = fwd.inputs[1], loss = fwd.outputs[0], lse = fwd.outputs[1];
    // Walking on from the cross_entropy node marks what depends on it (`moved`), until a backward qualifies.
    std::vector<bool> reached(g.values.size(), false), moved(g.nodes.size(), false);
    reached[static_cast<size_t>(loss)] = reached[static_cast<size_t>(lse)] = true;
    for (size_t b = f + 1; b < g.nodes.size(); ++b) {
      const Node& n = g.nodes[b];
      const CrossEntropyAttrs* bwd = match<CrossEntropyAttrs>(*n.prim);
      const bool pair = bwd && bwd->backward && n.inputs.size() == 4 && n.inputs[1] == logits && n.inputs[2] == lse &&
                        n.inputs[3] == target && same_attrs(*fwd.prim, *n.prim);
      const int32_t dloss = pair ? n.inputs[0] : -1;
      if (dloss >= 0 && !reached[static_cast<size_t>(dloss)] && value(dloss).dtype == value(loss).dtype &&
          value(dloss).shape == value(loss).shape) {
        const CrossEntropyAttrs attrs = *ce;
        Node fused = n;  // the backward's forward=false: remat keeps the logits alive until it runs
        fused.prim = make_cross_entropy_fused(attrs.ignore_index, attrs.label_smoothing);
        fused.inputs = {logits, target, dloss};
        fused.outputs = {loss, lse, n.outputs[0]};
        fused.loc = fwd.loc;
        fused.group = -1;
        g.values[static_cast<size_t>(n.outputs[0])].output_index = 2;
        std::vector<Node> nodes;
        nodes.reserve(g.nodes.size() - 1);
        for (size_t i = 0; i < b; ++i)
          if (i != f && !moved[i]) nodes.push_back(std::move(g.nodes[i]));
        nodes.push_back(std::move(fused));
        for (size_t i = f + 1; i < b; ++i)
          if (moved[i]) nodes.push_back(std::move(g.nodes[i]));
        for (size_t i = b + 1; i < g.nodes.size(); ++i) nodes.push_back(std::move(g.nodes[i]));
        g.nodes = std::move(nodes);
        g.renumber_nodes();
        return true;
      }
      bool depends = false;
      for (int32_t v : n.inputs) depends = depends || (v >= 0 && reached[static_cast<size_t>(v)]);
      if (!depends) continue;
      moved[b] = true;
      for (int32_t v : n.outputs) reached[static_cast<size_t>(v)] = true;
    }
  }
  return false;
}

}  // namespace

bool fuse_cross_entropy(Graph& g, const FuseCrossEntropyOptions&) {
  bool changed = false;
  while (fuse_one(g)) changed = true;
  return changed;
}

}  // namespace ingot::compiler::passes
