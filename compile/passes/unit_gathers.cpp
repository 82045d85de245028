// unit_gathers: see unit_gathers.h. Note [ZeRO-3 in a traced step] (distributed/fsdp_compiled.cpp) says where
// the unit gathers come from.
#include "compile/passes/unit_gathers.h"

#include <algorithm>
#include <map>

#include "autograd/ops/attrs.h"
#include "autograd/primitive_collective.h"
#include "compile/lower/lowering.h"

namespace ingot::compiler::passes {
namespace {

const UnitCollectiveAttrs* unit_gather(const Node& n) {
  if (!is_all_gather_start(*n.prim)) return nullptr;
  return match<UnitCollectiveAttrs>(*n.prim);
}

bool is_view(const Node& n) { return n.prim->fusion_kind() == FusionKind::View && !n.inputs.empty(); }

// A unit gather as the graph holds it: its start, its wait and the forward views of the gathered value
// (narrow + reshape per parameter, and views of those), in node order.
struct Window {
  int32_t start = -1, wait = -1;
  std::vector<int32_t> views;
  std::vector<bool> in_closure;  // per value: the wait's output or a view in `views`
  int32_t first_use = -1;        // the first node reading the closure that is not one of its views
};

Window window_of(const Graph& g, int32_t start, const std::vector<std::vector<int32_t>>& readers) {
  Window w;
  w.start = start;
  w.in_closure.assign(g.values.size(), false);
  const int32_t out = g.nodes[static_cast<size_t>(start)].outputs[0];
  for (int32_t r : readers[static_cast<size_t>(out)])
    if (is_collective_wait(*g.nodes[static_cast<size_t>(r)].prim)) w.wait = r;
  if (w.wait < 0) return w;
  const bool fwd = g.nodes[static_cast<size_t>(start)].forward;
  w.in_closure[static_cast<size_t>(g.nodes[static_cast<size_t>(w.wait)].outputs[0])] = true;
  for (size_t i = static_cast<size_t>(w.wait) + 1; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    bool reads = false;
    for (int32_t v : n.inputs) reads = reads || (v >= 0 && w.in_closure[static_cast<size_t>(v)]);
    if (!reads) continue;
    // Views made where the gather was (the forward's parameter views, or their copies) belong to it; views a
    // backward op takes of a parameter (a transpose) are readers like any other op.
    if (is_view(n) && n.forward == fwd && w.in_closure[static_cast<size_t>(n.inputs[0])]) {
      w.views.push_back(static_cast<int32_t>(i));
      for (int32_t o : n.outputs) w.in_closure[static_cast<size_t>(o)] = true;
    } else if (w.first_use < 0) {
      w.first_use = static_cast<int32_t>(i);
    }
  }
  return w;
}


// (a): the backward readers of each regather window read copies of its start, wait and views.
bool split_backward_gathers(Graph& g) {
  const auto readers = g.readers();
  std::vector<std::pair<int32_t, Node>> inserts;  // (insert before node index, copy)
  for (size_t s = 0; s < g.nodes.size(); ++s) {
    const UnitCollectiveAttrs* a = unit_gather(g.nodes[s]);
    if (!a || !a->regather || !g.nodes[s].forward) continue;
    const Window w = window_of(g, static_cast<int32_t>(s), readers);
    if (w.wait < 0) continue;
    std::vector<int32_t> backward;  // readers of the closure that are backward nodes
    for (size_t i = static_cast<size_t>(w.wait) + 1; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      if (n.forward || std::find(w.views.begin(), w.views.end(), static_cast<int32_t>(i)) != w.views.end()) continue;
      for (int32_t v : n.inputs)
        if (v >= 0 && w.in_closure[static_cast<size_t>(v)]) {
          backward.push_back(static_cast<int32_t>(i));
          break;
        }
    }
    if (backward.empty()) continue;
    const int32_t at = backward.front();
    std::map<int32_t, int32_t> copy_of;  // value -> its copy
    auto copy_node = [&](int32_t id) {
      const Node& old = g.nodes[static_cast<size_t>(id)];
      Node c;
      c.prim = old.prim;
      c.loc = old.loc;
      c.forward = false;
      for (int32_t v : old.inputs) c.inputs.push_back(copy_of.count(v) ? copy_of[v] : v);
      for (int32_t o : old.outputs) {
        const Value& ov = g.values[static_cast<size_t>(o)];
        const int32_t nv = g.add_value(ov.dtype, ov.device, ov.shape);
        copy_of[o] = nv;
        c.outputs.push_back(nv);
      }
      inserts.emplace_back(at, std::move(c));
    };
    copy_node(w.start);
    copy_node(w.wait);
    for (int32_t v : w.views) copy_node(v);
    for (int32_t b : backward)
      for (int32_t& v : g.nodes[static_cast<size_t>(b)].inputs)
        if (v >= 0 && copy_of.count(v)) v = copy_of[v];
  }
  if (inserts.empty()) return false;
  std::stable_sort(inserts.begin(), inserts.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size() + inserts.size());
  size_t k = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    while (k < inserts.size() && inserts[k].first == static_cast<int32_t>(i)) nodes.push_back(std::move(inserts[k++].second));
    nodes.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(nodes);
  g.renumber_nodes();
  return true;
}

// (b): each window's start waits for a token of the window before it.
bool order_prefetches(Graph& g) {
  const auto readers = g.readers();
  std::vector<Window> windows;
  for (size_t s = 0; s < g.nodes.size(); ++s)
    if (unit_gather(g.nodes[s]) && g.nodes[s].inputs.size() == 1) {
      Window w = window_of(g, static_cast<int32_t>(s), readers);
      if (w.wait >= 0 && w.first_use >= 0) windows.push_back(std::move(w));
    }
  std::stable_sort(windows.begin(), windows.end(),
                   [](const Window& x, const Window& y) { return x.first_use < y.first_use; });
  bool changed = false;
  for (size_t i = 1; i < windows.size(); ++i) {
    const Window &prev = windows[i - 1], &cur = windows[i];
    Node& start = g.nodes[static_cast<size_t>(cur.start)];
    int32_t token = -1, token_node = prev.wait;
    if (!start.forward && g.nodes[static_cast<size_t>(prev.start)].forward) {
      // The backward's first gather: not before the backward begins (the forward's last unit is still computing
      // when its own wait runs).
      token_node = -1;
      for (int32_t n = prev.first_use + 1; n < cur.start && token_node < 0; ++n) {
        const Node& x = g.nodes[static_cast<size_t>(n)];
        if (!x.forward && x.prim->fusion_kind() == FusionKind::Opaque && !x.outputs.empty() &&
            schedule_class(*x.prim) == 0)
          token_node = n;
      }
      if (token_node < 0) token_node = prev.wait;
    }
    if (token_node >= cur.start) continue;  // keeps the order topological
    token = g.nodes[static_cast<size_t>(token_node)].outputs[0];
    start.inputs.push_back(token);
    changed = true;
  }
  return changed;
}

// The traced run's unit boundaries (identities whose backward gathered a unit again while tracing) carry the
// unit's attributes and no collective: every reader reads their input instead.
bool drop_boundaries(Graph& g) {
  std::vector<bool> drop(g.nodes.size(), false);
  bool any = false;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!match<UnitCollectiveAttrs>(*n.prim) || schedule_class(*n.prim) != 0 || n.inputs.size() != 1 ||
        n.outputs.size() != 1 || n.inputs[0] < 0)
      continue;
    g.replace_uses(n.outputs[0], n.inputs[0]);
    drop[i] = any = true;
  }
  if (any) g.rewrite_nodes({}, drop);
  return any;
}

}  // namespace

bool unit_gathers(Graph& g, const UnitGathersOptions&) {
  const bool dropped = drop_boundaries(g);
  const bool split = split_backward_gathers(g);
  const bool ordered = order_prefetches(g);
  return dropped || split || ordered;
}

}  // namespace ingot::compiler::passes
