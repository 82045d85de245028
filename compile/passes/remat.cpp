// Rematerialization under a memory budget (invariant: remat.h). A value is "saved" when a forward node makes it
// and a backward node reads it: it stays alive from the forward to the backward. The chains recomputed start at
// graph inputs or other saved values (a GELU output is saved through the reshape its linear applies); the
// forward originals serve forward readers only, and dce drops them when there are none.
//
// Note [Saved values remade for free]
// Autograd saves what each op's backward reads, op by op: a SwiGLU silu(g) * u saves g for silu's gradient and
// silu(g), u for the product's. silu(g) is then kept from the forward to the backward although the backward reads
// g anyway: in the 8B Llama that is 117 MB per block (4096 x 14336 bf16), 3.76 GB of a LoRA step's 34.5 GB peak.
// A saved value is free to remake when (1) a pointwise op makes it from graph inputs or other values kept for the
// backward, (2) those inputs stay alive at least until its first backward reader (remaking it extends no lifetime),
// and (3) its backward readers are all pointwise, so the remade copy fuses into their kernel (Note [Sibling
// fusion], fuse.cpp): the backward reads the inputs it reads anyway instead of the saved value, and the forward no
// longer writes it. Such values are remade at every budget, before the budget's own choices, when the step's ops
// become generated kernels (with eager kernels the copy would be a kernel of its own). torch.compile's partitioner
// makes the same choice for pointwise ops. Their inputs are pinned: the budget never remakes a value a free copy
// reads, so the copy reads a kept value.
#include "compile/passes/remat.h"

#include <algorithm>
#include <functional>
#include <map>

namespace ingot::compiler::passes {

bool remat(Graph& g, const RematOptions& o, int64_t* recomputed_bytes, int64_t* saved_bytes) {
  const double budget = o.budget;
  constexpr int kMaxDepth = 4;
  if (recomputed_bytes) *recomputed_bytes = 0;
  if (saved_bytes) *saved_bytes = 0;
  if (budget >= 1.0 && !o.generated) return false;
  const size_t nv = g.values.size();
  std::vector<int32_t> first_bwd(nv, -1), last_bwd(nv, -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i].forward) continue;
    for (int32_t v : g.nodes[i].inputs) {
      if (v < 0) continue;
      if (first_bwd[static_cast<size_t>(v)] < 0) first_bwd[static_cast<size_t>(v)] = static_cast<int32_t>(i);
      last_bwd[static_cast<size_t>(v)] = static_cast<int32_t>(i);
    }
  }
  auto bytes = [&](int32_t v) {
    const Value& x = g.values[static_cast<size_t>(v)];
    return numel(trace_shape(x.shape)) * static_cast<int64_t>(itemsize(x.dtype));
  };
  auto node_of = [&](int32_t v) -> const Node* {
    const int32_t p = g.values[static_cast<size_t>(v)].producer;
    return p < 0 ? nullptr : &g.nodes[static_cast<size_t>(p)];
  };
  std::vector<bool> saved(nv, false), chosen(nv, false), pinned(nv, false);
  int64_t total = 0;
  for (size_t v = 0; v < nv; ++v) {
    const Node* p = node_of(static_cast<int32_t>(v));
    if (!p || first_bwd[v] < 0 || !p->forward) continue;
    saved[v] = true;
    total += bytes(static_cast<int32_t>(v));
  }
  if (saved_bytes) *saved_bytes = total;
  // Available in backward without recomputing: graph inputs and saved values not chosen.
  auto available = [&](int32_t v) { return !node_of(v) || (saved[static_cast<size_t>(v)] && !chosen[static_cast<size_t>(v)]); };
  std::function<bool(int32_t, int)> recomputable = [&](int32_t v, int depth) {
    const Node* p = node_of(v);
    if (!p || depth == 0 || !p->prim->cheap_to_recompute()) return false;
    for (int32_t in : p->inputs)
      if (in >= 0 && !available(in) && !recomputable(in, depth - 1)) return false;
    return true;
  };
  const std::vector<std::vector<int32_t>> readers = g.readers();
  // Note [Saved values remade for free]: conditions (1) to (3).
  auto free_to_remake = [&](int32_t v) {
    const Node* p = node_of(v);
    if (!o.generated || p->prim->fusion_kind() != FusionKind::Pointwise || p->outputs.size() != 1) return false;
    for (int32_t in : p->inputs) {
      if (in < 0) continue;
      if (!available(in)) return false;
      if (node_of(in) && last_bwd[static_cast<size_t>(in)] < first_bwd[static_cast<size_t>(v)]) return false;
    }
    for (int32_t r : readers[static_cast<size_t>(v)]) {
      const Node& n = g.nodes[static_cast<size_t>(r)];
      if (!n.forward && n.prim->fusion_kind() != FusionKind::Pointwise) return false;
    }
    return true;
  };
  std::vector<int32_t> frees, cands;
  for (size_t v = 0; v < nv; ++v) {
    if (!saved[v]) continue;
    if (free_to_remake(static_cast<int32_t>(v))) frees.push_back(static_cast<int32_t>(v));
    else if (budget < 1.0 && recomputable(static_cast<int32_t>(v), kMaxDepth)) cands.push_back(static_cast<int32_t>(v));
  }
  std::stable_sort(cands.begin(), cands.end(), [&](int32_t a, int32_t b) { return bytes(a) > bytes(b); });
  int64_t kept = total;
  const int64_t target = static_cast<int64_t>(budget * static_cast<double>(total));
  std::vector<std::pair<int32_t, Node>> inserts;  // (insert before node index, recompute node), in order
  // Original value -> (its recomputed copy, the node index the copy is inserted before), for every output of a
  // copied node: a later candidate at or after that index reads the copy (a norm's statistics come with its
  // recomputed output, not from a second recompute).
  std::map<int32_t, std::pair<int32_t, int32_t>> memo;
  // Free values first, whatever the budget; then the budget's choices, largest first, skipping the inputs of free
  // copies (pinned).
  std::vector<std::pair<int32_t, bool>> order;  // (value, free)
  for (int32_t v : frees) order.emplace_back(v, true);
  for (int32_t v : cands) order.emplace_back(v, false);
  for (const auto& [v, free] : order) {
    if (free) {
      if (!free_to_remake(v)) continue;  // an input was itself remade for free just before
      for (int32_t in : node_of(v)->inputs)
        if (in >= 0) pinned[static_cast<size_t>(in)] = true;
    } else {
      if (kept <= target) break;
      if (pinned[static_cast<size_t>(v)]) continue;
    }
    const int32_t at = first_bwd[static_cast<size_t>(v)];
    std::function<int32_t(int32_t, bool)> emit = [&](int32_t u, bool root) -> int32_t {
      if (!root && available(u)) return u;
      if (auto it = memo.find(u); it != memo.end() && it->second.second <= at) return it->second.first;
      const Node& p = *node_of(u);
      Node copy;
      copy.prim = p.prim;
      copy.loc = p.loc;
      for (int32_t in : p.inputs) copy.inputs.push_back(in < 0 ? in : emit(in, false));
      for (int32_t out : p.outputs) {
        const Value old = g.values[static_cast<size_t>(out)];  // a copy: add_value may move the values
        const int32_t nu = g.add_value(old.dtype, old.device, old.shape);
        copy.outputs.push_back(nu);
        memo[out] = {nu, at};
      }
      inserts.emplace_back(at, std::move(copy));
      return memo.at(u).first;
    };
    const int32_t nv_id = emit(v, true);
    chosen[static_cast<size_t>(v)] = true;
    for (size_t i = static_cast<size_t>(at); i < g.nodes.size(); ++i)
      if (!g.nodes[i].forward)
        for (int32_t& in : g.nodes[i].inputs)
          if (in == v) in = nv_id;
    kept -= bytes(v);
  }
  if (inserts.empty()) return false;
  std::stable_sort(inserts.begin(), inserts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Node> nodes;
  size_t k = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    while (k < inserts.size() && inserts[k].first == static_cast<int32_t>(i)) nodes.push_back(std::move(inserts[k++].second));
    nodes.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(nodes);
  g.renumber_nodes();
  if (recomputed_bytes) *recomputed_bytes = total - kept;
  return true;
}

}  // namespace ingot::compiler::passes
