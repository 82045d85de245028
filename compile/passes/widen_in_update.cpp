// Narrow gradients read by the optimizer update (invariant and Note [Narrow gradients read by the update]:
// widen_in_update.h).
#include "compile/passes/widen_in_update.h"

#include <functional>
#include <map>
#include <optional>
#include <set>

#include "autograd/ops/attrs.h"
#include "autograd/primitive_multi_tensor.h"

namespace ingot::compiler::passes {

namespace {

bool is_view(const Node& n) { return n.prim->fusion_kind() == FusionKind::View && n.inputs.size() == 1; }

bool narrow_float(DType d) { return d == DType::bf16 || d == DType::f16; }

}  // namespace

bool widen_in_update(Graph& g, const WidenInUpdateOptions&) {
  const std::vector<std::vector<int32_t>> readers = g.readers();
  auto producer = [&](int32_t v) { return v < 0 ? -1 : g.values[static_cast<size_t>(v)].producer; };
  // The gradient slots of updates that widen: (update node, input index).
  std::map<int32_t, std::vector<size_t>> grad_slots;
  std::set<std::pair<int32_t, int32_t>> grad_reads;  // (node, value) read as a gradient
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const MultiTensorUpdate* u = as_multi_tensor_update(*g.nodes[i].prim);
    if (!u || !u->widens_gradients()) continue;
    const size_t count = u->tensors();
    if (count == 0 || g.nodes[i].inputs.size() != 1 + u->input_slots() * count) continue;
    for (size_t t = 0; t < count; ++t) {
      grad_slots[static_cast<int32_t>(i)].push_back(1 + count + t);
      grad_reads.insert({static_cast<int32_t>(i), g.nodes[i].inputs[1 + count + t]});
    }
  }
  if (grad_slots.empty()) return false;
  // A widening cast qualifies when every reader of its output, through views alone, is a gradient slot of such an
  // update (and the value is read there once) and nothing on the way is a graph output.
  std::function<bool(int32_t, std::vector<int32_t>&)> only_gradients = [&](int32_t v, std::vector<int32_t>& views) {
    if (g.is_root(v)) return false;
    for (int32_t r : readers[static_cast<size_t>(v)]) {
      const Node& n = g.nodes[static_cast<size_t>(r)];
      if (is_view(n)) {
        views.push_back(r);
        if (!only_gradients(n.outputs[0], views)) return false;
        continue;
      }
      if (!grad_reads.count({r, v})) return false;
      size_t reads = 0;
      for (int32_t in : n.inputs) reads += in == v;
      if (reads != 1) return false;
    }
    return !readers[static_cast<size_t>(v)].empty();
  };
  struct Cast {
    DType narrow;
    std::vector<int32_t> views;  // the view nodes below it, retyped
  };
  std::map<int32_t, Cast> casts;  // cast node -> what rewriting it changes
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!match<CastAttrs>(*n.prim) || n.inputs.size() != 1 || n.outputs.size() != 1) continue;
    const DType from = g.values[static_cast<size_t>(n.inputs[0])].dtype;
    if (!narrow_float(from) || g.values[static_cast<size_t>(n.outputs[0])].dtype != DType::f32) continue;
    std::vector<int32_t> views;
    if (only_gradients(n.outputs[0], views)) casts[static_cast<int32_t>(i)] = {from, std::move(views)};
  }
  // The cast a gradient value comes from (through views), if one qualifies.
  auto root_cast = [&](int32_t v) -> int32_t {
    for (int32_t p = producer(v); p >= 0; p = producer(g.nodes[static_cast<size_t>(p)].inputs[0])) {
      if (casts.count(p)) return p;
      if (!is_view(g.nodes[static_cast<size_t>(p)])) return -1;
    }
    return -1;
  };
  // An update takes narrow gradients for all of its slots or none; a cast some of whose updates cannot goes (and
  // the updates it feeds are checked again), until nothing changes.
  for (bool dropped = true; dropped;) {
    dropped = false;
    for (const auto& [node, slots] : grad_slots) {
      std::optional<DType> narrow;
      bool all = true;
      for (size_t s : slots) {
        const int32_t c = root_cast(g.nodes[static_cast<size_t>(node)].inputs[s]);
        if (c < 0 || (narrow && *narrow != casts.at(c).narrow)) {
          all = false;
          break;
        }
        narrow = casts.at(c).narrow;
      }
      if (all) continue;
      for (size_t s : slots) {
        const int32_t c = root_cast(g.nodes[static_cast<size_t>(node)].inputs[s]);
        if (c >= 0) {
          casts.erase(c);
          dropped = true;
        }
      }
    }
  }
  if (casts.empty()) return false;
  std::vector<bool> drop(g.nodes.size(), false);
  for (const auto& [c, cast] : casts) {
    const Node& cn = g.nodes[static_cast<size_t>(c)];
    for (int32_t r : cast.views) g.values[static_cast<size_t>(g.nodes[static_cast<size_t>(r)].outputs[0])].dtype = cast.narrow;
    g.replace_uses(cn.outputs[0], cn.inputs[0]);  // the wide value is no root (only_gradients): node inputs only
    drop[static_cast<size_t>(c)] = true;
  }
  g.rewrite_nodes({}, drop);
  return true;
}

}  // namespace ingot::compiler::passes
