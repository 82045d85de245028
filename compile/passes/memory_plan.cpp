// Memory planning. The result is the size of one arena in which every intermediate buffer (a node output that is
// not a view and does not escape as an output, write-back or grad) gets a place, two buffers overlapping only if
// their live ranges are disjoint. A buffer is live from the step that makes it to the last step that reads it or
// any view of it (views alias their base and cost nothing); an output that the executor computes into a buffer
// dying at its node (Note [Outputs over dead inputs], autograd/primitive.h: the cross-entropy gradient over the
// logits, which reach the loss through a reshape) continues that buffer. Blocks are reused best-fit once dead.
// The executor allocates each value from the caching allocator; the arena size is the planned peak, reported
// (CompileStats, INGOT_LOGS=schedule) next to the sum-of-live-bytes peak it approximates.
// Test: tests/compile/passes/test_passes.cpp (MemoryPlan.*), tests/compile/exec/test_buffer_reuse.cpp.
#include "compile/passes/memory_plan.h"

#include <map>
#include <optional>

namespace ingot::compiler::passes {
namespace {
constexpr int64_t kAlign = 64;
int64_t align_up(int64_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
}  // namespace

MemoryPlan memory_plan(const Graph& g) {
  MemoryPlan plan;
  const size_t nv = g.values.size();
  // Where each buffer would sit in the arena, and its size: what the placement needs to find the arena's size.
  std::vector<int64_t> offset(nv, -1), bytes(nv, 0);
  std::vector<int32_t> base(nv), def(nv, -1), end(nv, -1);
  for (size_t v = 0; v < nv; ++v) base[v] = static_cast<int32_t>(v);
  std::vector<bool> escapes(nv, false);
  // Where each buffer is last read (through views, before any reuse), and which buffers are roots.
  std::vector<int32_t> plain(nv), read_last(nv, -1);
  for (size_t v = 0; v < nv; ++v) plain[v] = static_cast<int32_t>(v);
  // Note [Values placed in buckets] (compile/ir/graph.h): a bucket's buffer is made by its first placed producer
  // and holds every placed value; the bucket's own view node is where the bucket value appears.
  std::vector<bool> bucket(nv, false);
  for (const Value& v : g.values)
    if (v.placed_in >= 0) bucket[static_cast<size_t>(v.placed_in)] = true;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    for (int32_t in : n.inputs)
      if (in >= 0) read_last[static_cast<size_t>(plain[static_cast<size_t>(in)])] = static_cast<int32_t>(i);
    if (n.prim->fusion_kind() == FusionKind::View && !n.inputs.empty() && n.inputs[0] >= 0 &&
        !bucket[static_cast<size_t>(n.outputs[0])])
      for (int32_t o : n.outputs) plain[static_cast<size_t>(o)] = plain[static_cast<size_t>(n.inputs[0])];
  }
  std::vector<bool> root(nv, false);
  for (int32_t o : g.outputs) root[static_cast<size_t>(plain[static_cast<size_t>(o)])] = true;
  for (const WriteBack& w : g.writebacks) root[static_cast<size_t>(plain[static_cast<size_t>(w.value)])] = true;
  for (const GradOut& go : g.grad_outs)
    if (go.value >= 0) root[static_cast<size_t>(plain[static_cast<size_t>(go.value)])] = true;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const bool view = n.prim->fusion_kind() == FusionKind::View && !n.inputs.empty() && n.inputs[0] >= 0;
    int32_t reuse = -1;  // a buffer dying here that an output of the same dtype and size takes over
    if (const std::optional<size_t> k = n.prim->reusable_input(); k && *k < n.inputs.size() && n.inputs[*k] >= 0) {
      const int32_t in = n.inputs[*k], b = base[static_cast<size_t>(in)];
      if (b == plain[static_cast<size_t>(in)] && g.values[static_cast<size_t>(b)].producer >= 0 &&
          !root[static_cast<size_t>(b)] && read_last[static_cast<size_t>(b)] == static_cast<int32_t>(i))
        reuse = b;
    }
    for (int32_t o : n.outputs) {
      if (const int32_t b = g.values[static_cast<size_t>(o)].placed_in; b >= 0 || bucket[static_cast<size_t>(o)]) {
        const int32_t in = b >= 0 ? b : o;
        base[static_cast<size_t>(o)] = in;
        if (def[static_cast<size_t>(in)] < 0) {
          const Value& bv = g.values[static_cast<size_t>(in)];
          def[static_cast<size_t>(in)] = end[static_cast<size_t>(in)] = static_cast<int32_t>(i);
          bytes[static_cast<size_t>(in)] = numel(trace_shape(bv.shape)) * static_cast<int64_t>(itemsize(bv.dtype));
        }
        continue;
      }
      if (view) {
        base[static_cast<size_t>(o)] = base[static_cast<size_t>(n.inputs[0])];
        continue;
      }
      const Value& v = g.values[static_cast<size_t>(o)];
      if (reuse >= 0 && v.dtype == g.values[static_cast<size_t>(reuse)].dtype &&
          numel(trace_shape(v.shape)) == numel(trace_shape(g.values[static_cast<size_t>(reuse)].shape))) {
        base[static_cast<size_t>(o)] = reuse;
        reuse = -1;
        continue;
      }
      def[static_cast<size_t>(o)] = end[static_cast<size_t>(o)] = static_cast<int32_t>(i);
      bytes[static_cast<size_t>(o)] = numel(trace_shape(v.shape)) * static_cast<int64_t>(itemsize(v.dtype));
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
    if (def[v] < 0 || escapes[v] || bytes[v] == 0) continue;
    made_at[static_cast<size_t>(def[v])].push_back(static_cast<int32_t>(v));
    dead_after[static_cast<size_t>(end[v])].push_back(static_cast<int32_t>(v));
  }
  std::multimap<int64_t, int64_t> free_blocks;  // size -> offset
  int64_t live = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (int32_t v : made_at[i]) {
      const int64_t need = align_up(bytes[static_cast<size_t>(v)]);
      auto it = free_blocks.lower_bound(need);
      if (it != free_blocks.end()) {
        offset[static_cast<size_t>(v)] = it->second;
        if (it->first > need) free_blocks.emplace(it->first - need, it->second + need);
        free_blocks.erase(it);
      } else {
        offset[static_cast<size_t>(v)] = plan.arena_bytes;
        plan.arena_bytes += need;
      }
      live += need;
    }
    plan.unplanned_peak = std::max(plan.unplanned_peak, live);
    for (int32_t v : dead_after[i]) {
      const int64_t need = align_up(bytes[static_cast<size_t>(v)]);
      free_blocks.emplace(need, offset[static_cast<size_t>(v)]);
      live -= need;
    }
  }
  return plan;
}

}  // namespace ingot::compiler::passes
