// Memory planning. Invariant of the result: every intermediate buffer (a node output that is not a view and
// does not escape as an output, write-back or grad) gets an offset in one arena; two buffers overlap only if
// their live ranges are disjoint. A buffer is live from the step that makes it to the last step that reads
// it or any view of it (views alias their base and cost nothing). Blocks are reused best-fit once dead; the
// arena size is the planned peak, reported next to the sum-of-live-bytes peak it approximates.
// Test: tests/compile/test_passes.cpp (MemoryPlan.*).
#include <map>

#include "compile/passes/passes.h"

namespace ingot::compiler::passes {
namespace {
constexpr int64_t kAlign = 64;
int64_t align_up(int64_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
}  // namespace

MemoryPlan memory_plan(const Graph& g) {
  MemoryPlan plan;
  const size_t nv = g.values.size();
  plan.offset.assign(nv, -1);
  plan.bytes.assign(nv, 0);
  std::vector<int32_t> base(nv), def(nv, -1), end(nv, -1);
  for (size_t v = 0; v < nv; ++v) base[v] = static_cast<int32_t>(v);
  std::vector<bool> escapes(nv, false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const bool view = n.prim->fusion_kind() == FusionKind::View && !n.inputs.empty() && n.inputs[0] >= 0;
    for (int32_t o : n.outputs) {
      if (view) {
        base[static_cast<size_t>(o)] = base[static_cast<size_t>(n.inputs[0])];
        continue;
      }
      const Value& v = g.values[static_cast<size_t>(o)];
      def[static_cast<size_t>(o)] = end[static_cast<size_t>(o)] = static_cast<int32_t>(i);
      plan.bytes[static_cast<size_t>(o)] = numel(trace_shape(v.shape)) * static_cast<int64_t>(itemsize(v.dtype));
    }
    for (int32_t in : n.inputs)
      if (in >= 0) {
        const int32_t b = base[static_cast<size_t>(in)];
        end[static_cast<size_t>(b)] = std::max(end[static_cast<size_t>(b)], static_cast<int32_t>(i));
      }
  }
  auto escape = [&](int32_t v) { escapes[static_cast<size_t>(base[static_cast<size_t>(v)])] = true; };
  for (int32_t o : g.outputs) escape(o);
  for (const WriteBack& w : g.writebacks) escape(w.value);
  for (const GradOut& go : g.grad_outs)
    if (go.value >= 0) escape(go.value);

  // Sweep the steps: free blocks of buffers dead before step i, then place buffers made at step i.
  std::vector<std::vector<int32_t>> made_at(g.nodes.size()), dead_after(g.nodes.size());
  for (size_t v = 0; v < nv; ++v) {
    if (def[v] < 0 || escapes[v] || plan.bytes[v] == 0) continue;
    made_at[static_cast<size_t>(def[v])].push_back(static_cast<int32_t>(v));
    dead_after[static_cast<size_t>(end[v])].push_back(static_cast<int32_t>(v));
  }
  std::multimap<int64_t, int64_t> free_blocks;  // size -> offset
  int64_t live = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (int32_t v : made_at[i]) {
      const int64_t need = align_up(plan.bytes[static_cast<size_t>(v)]);
      auto it = free_blocks.lower_bound(need);
      if (it != free_blocks.end()) {
        plan.offset[static_cast<size_t>(v)] = it->second;
        if (it->first > need) free_blocks.emplace(it->first - need, it->second + need);
        free_blocks.erase(it);
      } else {
        plan.offset[static_cast<size_t>(v)] = plan.arena_bytes;
        plan.arena_bytes += need;
      }
      live += need;
    }
    plan.unplanned_peak = std::max(plan.unplanned_peak, live);
    for (int32_t v : dead_after[i]) {
      const int64_t need = align_up(plan.bytes[static_cast<size_t>(v)]);
      free_blocks.emplace(need, plan.offset[static_cast<size_t>(v)]);
      live -= need;
    }
  }
  return plan;
}

}  // namespace ingot::compiler::passes
