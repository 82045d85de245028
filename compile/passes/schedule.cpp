// Scheduling (invariant: schedule.h). Among ready nodes the one earliest in the traced order goes first: the
// trace order already frees forward activations as backward consumes them, and keeping it keeps peak memory
// where eager has it. Groups are acyclic by fuse.h's invariant.
// Collectives (compile/lower/lowering.h: schedule_class) bend the order: a collective's start, and the views and
// concatenations whose results only feed starts (a bucket's flatten and concatenation), go before other
// ready work; a wait goes after all other ready work (one holding an ordering token as early as a start:
// unit_reductions.h). A gradient bucket is then reduced while
// the rest of the backward runs, and the optimizer waits for it last; with collectives an optimizer update's part
// goes as early as a start (its gradients die there).
#include "compile/passes/schedule.h"

#include <algorithm>
#include <queue>

#include "autograd/primitive_collective.h"
#include "autograd/primitive_multi_tensor.h"
#include "compile/lower/lowering.h"

namespace ingot::compiler::passes {

bool schedule(Graph& g, const ScheduleOptions&) {
  const size_t n = g.nodes.size();
  // Units: a group, or a node alone. unit_of[node]; members in graph order.
  std::vector<int32_t> unit_of(n);
  std::vector<std::vector<int32_t>> members;
  std::vector<int32_t> unit_of_group(g.groups.size(), -1);
  for (size_t i = 0; i < n; ++i) {
    const int32_t G = g.nodes[i].group;
    if (G >= 0 && unit_of_group[static_cast<size_t>(G)] >= 0) {
      unit_of[i] = unit_of_group[static_cast<size_t>(G)];
    } else {
      unit_of[i] = static_cast<int32_t>(members.size());
      if (G >= 0) unit_of_group[static_cast<size_t>(G)] = unit_of[i];
      members.emplace_back();
    }
    members[static_cast<size_t>(unit_of[i])].push_back(static_cast<int32_t>(i));
  }
  const size_t units = members.size();
  std::vector<std::vector<int32_t>> succ(units);
  std::vector<int32_t> indeg(units, 0);
  for (size_t i = 0; i < n; ++i)
    for (int32_t v : g.nodes[i].inputs) {
      if (v < 0) continue;
      const int32_t p = g.values[static_cast<size_t>(v)].producer;
      if (p < 0 || unit_of[static_cast<size_t>(p)] == unit_of[i]) continue;
      succ[static_cast<size_t>(unit_of[static_cast<size_t>(p)])].push_back(unit_of[i]);
      ++indeg[static_cast<size_t>(unit_of[i])];
    }
  // Scheduling class per unit: -1 early, 0 trace order, +1 late. A glue unit whose consumers are all early
  // (and that has some) is early too; units are in trace order, so one reverse sweep settles the chains.
  std::vector<int> cls(units, 0);
  bool collectives = false;
  for (const Node& node : g.nodes) collectives = collectives || is_collective_wait(*node.prim);
  for (size_t u = 0; u < units; ++u)
    for (int32_t m : members[u]) {
      const Node& node = g.nodes[static_cast<size_t>(m)];
      int c = schedule_class(*node.prim);
      // A wait given a later collective as its token (Note [Unit reductions are waited for a unit later],
      // unit_reductions.h) releases its collective's input there; as a plain late wait it would run only once
      // nothing else is ready, at the backward's end.
      if (c > 0 && node.inputs.size() > 1) c = -1;
      // Data parallel: a part of a split optimizer update (per gradient bucket or ZeRO-3 unit) runs as soon as its
      // gradients are reduced: in trace order it would wait for the whole backward, every rank's gradient shards
      // alive until then (7.5 GB of an 8B model's on each of two GPUs). A plain DDP bucket's wait is late, so its
      // update still runs after the backward; a ZeRO-3 unit's is waited for a unit later, inside it. Without
      // collectives (split_update under a memory budget) the trace order stands: that pass put each update after
      // every reader of its parameter, which nothing else orders before it, and an update run before a reader
      // could not overwrite the parameter in place (compile/exec/executor.cpp: in_place_ok).
      if (c == 0 && collectives && as_splittable_update(*node.prim)) c = -1;
      if (c != 0) cls[u] = c;
    }
  bool any_early = false;
  for (int c : cls) any_early = any_early || c < 0;
  // Only data-movement glue (views, concatenation) inherits "early": the compute that makes a gradient keeps
  // its trace order, or every backward op feeding a bucket would jump ahead of the rest of the backward.
  auto glue = [&](size_t u) {
    for (int32_t m : members[u])
      if (!is_layout_glue(*g.nodes[static_cast<size_t>(m)].prim)) return false;
    return true;
  };
  if (any_early)
    for (size_t u = units; u-- > 0;) {
      if (cls[u] != 0 || succ[u].empty() || !glue(u)) continue;
      bool all_early = true;
      for (int32_t s : succ[u]) all_early = all_early && cls[static_cast<size_t>(s)] < 0;
      if (all_early) cls[u] = -1;
    }
  // The classes only reorder ready units: any order the queue produces is topological, so they cannot change
  // results, only when communication starts and ends.
  using Key = std::pair<int, int32_t>;  // (class, first member's index)
  std::priority_queue<Key, std::vector<Key>, std::greater<>> ready;
  auto push = [&](int32_t u) { ready.push({cls[static_cast<size_t>(u)], u}); };
  for (size_t u = 0; u < units; ++u)
    if (indeg[u] == 0) push(static_cast<int32_t>(u));
  std::vector<int32_t> order;
  while (!ready.empty()) {
    const int32_t u = ready.top().second;
    ready.pop();
    for (int32_t m : members[static_cast<size_t>(u)]) order.push_back(m);
    for (int32_t s : succ[static_cast<size_t>(u)])
      if (--indeg[static_cast<size_t>(s)] == 0) push(s);
  }
  INGOT_INTERNAL_CHECK(order.size() == n, "schedule: fusion groups form a cycle (", order.size(), " of ", n,
                       " nodes scheduled)");
  bool changed = false;
  for (size_t i = 0; i < n; ++i) changed = changed || order[i] != static_cast<int32_t>(i);
  if (!changed) return false;
  std::vector<Node> nodes;
  nodes.reserve(n);
  for (int32_t i : order) nodes.push_back(std::move(g.nodes[static_cast<size_t>(i)]));
  g.nodes = std::move(nodes);
  // Keep the groups: renumber ids in place (renumber_nodes() would drop them).
  std::vector<int32_t> new_id(n);
  for (size_t i = 0; i < n; ++i) new_id[static_cast<size_t>(order[i])] = static_cast<int32_t>(i);
  for (size_t i = 0; i < n; ++i) {
    g.nodes[i].id = static_cast<int32_t>(i);
    for (int32_t v : g.nodes[i].outputs) g.values[static_cast<size_t>(v)].producer = static_cast<int32_t>(i);
  }
  for (FusionGroup& fg : g.groups) {
    for (int32_t& m : fg.nodes) m = new_id[static_cast<size_t>(m)];
    std::sort(fg.nodes.begin(), fg.nodes.end());
  }
  return true;
}

}  // namespace ingot::compiler::passes
