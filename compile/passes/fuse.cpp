// Fusion grouping (invariant: fuse.h). Contracting a group never creates a cycle between groups because a node
// joins a group only when none of its other inputs depends on the group. View and Opaque nodes stay alone: views
// are free aliases, opaque ops (matmul, attention) call the eager kernels. So does a sum over the rows of a tall
// bf16 / f16 CUDA matrix that nothing pointwise feeds (a bias gradient): the eager kernel's 16-byte column path is
// faster than a generated column reduction (Note [Column sums], runtime/kernels/cuda/reduce.cu).
#include "compile/passes/fuse.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "autograd/ops/attrs.h"
#include "compile/lower/lowering.h"
#include "compile/passes/decompose_norm_bwd.h"

namespace ingot::compiler::passes {

// Note [Column sums]: the shapes runtime/kernels/cuda/reduce.cu's column path takes, with no fusible prologue.
bool eager_column_sum(const Graph& g, const Node& n) {
  const ReduceAttrs* r = match<ReduceAttrs>(*n.prim);
  if (!r || r->op != kernels::ReduceOp::Sum || r->dims != std::vector<int64_t>{0} || r->keepdim) return false;
  const Value& in = g.values[static_cast<size_t>(n.inputs[0])];
  if (!in.device.is_cuda() || (in.dtype != DType::bf16 && in.dtype != DType::f16)) return false;
  const Shape s = trace_shape(in.shape);
  if (s.size() != 2 || s[0] < 2048 || s[1] < 256 || s[1] % 8 != 0) return false;
  return in.producer < 0 ||
         g.nodes[static_cast<size_t>(in.producer)].prim->fusion_kind() != FusionKind::Pointwise;
}

namespace {

// Note [Parameter casts]: a bf16 step casts every f32 master weight for its matmuls: 7 casts per GPT-2 block, 100
// small kernels of 1-7 us (0.5 ms on an H100 for 124M parameters). As one multi-tensor kernel they are one pass over
// the parameters. Only casts that would be singleton groups anyway (every reader opaque) are taken.
bool parameter_cast(const Graph& g, const std::vector<std::vector<int32_t>>& readers, const Node& n) {
  if (!match<CastAttrs>(*n.prim) || n.outputs.size() != 1) return false;
  const Value& in = g.values[static_cast<size_t>(n.inputs[0])];
  const Value& out = g.values[static_cast<size_t>(n.outputs[0])];
  if (in.producer >= 0 || in.dtype != DType::f32 || !in.device.is_cuda() ||
      (out.dtype != DType::bf16 && out.dtype != DType::f16) || g.is_root(n.outputs[0]))
    return false;
  for (int32_t r : readers[static_cast<size_t>(n.outputs[0])])
    if (g.nodes[static_cast<size_t>(r)].prim->fusion_kind() != FusionKind::Opaque) return false;
  return !readers[static_cast<size_t>(n.outputs[0])].empty();
}

struct Grouping {
  Graph& g;
  std::vector<int32_t> group_of;  // per node
  std::vector<int32_t> first;     // per group: smallest member node
  std::vector<Shape> shape;       // per group: the iteration shape
  std::vector<bool> has_reduction;
  std::vector<GroupKind> kind;

  explicit Grouping(Graph& graph) : g(graph), group_of(graph.nodes.size(), -1) {}

  int32_t producer_node(int32_t v) const { return v < 0 ? -1 : g.values[static_cast<size_t>(v)].producer; }

  // True when node `from` (outside group G) transitively reads an output of a member of G.
  bool depends_on(int32_t from, int32_t G) const {
    std::vector<int32_t> stack{from};
    std::set<int32_t> seen{from};
    while (!stack.empty()) {
      const int32_t n = stack.back();
      stack.pop_back();
      if (n < first[static_cast<size_t>(G)]) continue;  // older than the group: cannot depend on it
      if (group_of[static_cast<size_t>(n)] == G) return true;
      for (int32_t v : g.nodes[static_cast<size_t>(n)].inputs) {
        const int32_t p = producer_node(v);
        if (p >= 0 && seen.insert(p).second) stack.push_back(p);
      }
    }
    return false;
  }

  bool can_join(int32_t n, int32_t G) const {
    for (int32_t v : g.nodes[static_cast<size_t>(n)].inputs) {
      const int32_t p = producer_node(v);
      if (p < 0 || group_of[static_cast<size_t>(p)] == G) continue;
      if (depends_on(p, G)) return false;
    }
    return true;
  }

  int32_t new_group(int32_t n, GroupKind k, Shape s) {
    const int32_t G = static_cast<int32_t>(first.size());
    first.push_back(n);
    shape.push_back(std::move(s));
    has_reduction.push_back(k == GroupKind::RowReduction);
    kind.push_back(k);
    group_of[static_cast<size_t>(n)] = G;
    return G;
  }
};

Shape out_shape(const Graph& g, const Node& n) {
  return n.outputs.empty() ? Shape{} : trace_shape(g.values[static_cast<size_t>(n.outputs[0])].shape);
}

bool same_output_shapes(const Graph& g, const Node& n, const Shape& s) {
  for (int32_t o : n.outputs)
    if (trace_shape(g.values[static_cast<size_t>(o)].shape) != s) return false;
  return true;
}

std::string group_name(const Graph& g, const FusionGroup& fg) {
  std::ostringstream os;
  os << "k" << fg.id;
  size_t shown = 0;
  for (int32_t n : fg.nodes) {
    if (shown++ == 4) {
      os << "_etc";
      break;
    }
    std::string name(g.nodes[static_cast<size_t>(n)].prim->name());
    os << "_" << name;
  }
  return os.str();
}

// Note [Sibling fusion]: a pointwise node with no producer group to join may join a pointwise group that
// reads one of its inputs at full size (shape = the group's), when both are in the same pass (forward or
// backward) and no cycle results. The case it is for: a GELU output recomputed in the backward (remat.cpp)
// and the GELU gradient both read the first MLP projection's output; as one kernel that output is read once
// and the recomputation costs no launch.
int32_t sibling_group(const Graph& g, const Grouping& gr, const std::vector<std::vector<int32_t>>& readers, int32_t n) {
  const Node& node = g.nodes[static_cast<size_t>(n)];
  for (int32_t v : node.inputs) {
    if (v < 0) continue;
    const Shape vs = trace_shape(g.values[static_cast<size_t>(v)].shape);
    for (int32_t r : readers[static_cast<size_t>(v)]) {
      const int32_t G = gr.group_of[static_cast<size_t>(r)];
      if (G < 0 || gr.kind[static_cast<size_t>(G)] != GroupKind::Pointwise) continue;
      const Shape& gs = gr.shape[static_cast<size_t>(G)];
      if (vs != gs || !same_output_shapes(g, node, gs)) continue;
      if (g.nodes[static_cast<size_t>(r)].forward != node.forward || !gr.can_join(n, G)) continue;
      return G;
    }
  }
  return -1;
}

// Note [Update copies]: with f32 master weights of bf16 parameters (mixed precision, LoRA's adapters), the step
// ends casting every updated master back into its parameter: one kernel per tensor, the 8B LoRA step's 256 adapter
// copies of 4.7 us each (1.2 ms). The casts of multi-tensor update outputs that nothing in the step reads (written
// back only) are one multi-tensor group, as the parameter casts are: they read only updates' outputs and nothing reads
// them, so joining never closes a cycle.
bool update_copy(const Graph& g, const std::vector<std::vector<int32_t>>& readers, const Node& n) {
  if (!match<CastAttrs>(*n.prim) || n.outputs.size() != 1) return false;
  const Value& in = g.values[static_cast<size_t>(n.inputs[0])];
  const Value& out = g.values[static_cast<size_t>(n.outputs[0])];
  return in.producer >= 0 && is_multi_tensor_update(*g.nodes[static_cast<size_t>(in.producer)].prim) &&
         in.dtype == DType::f32 && in.device.is_cuda() && (out.dtype == DType::bf16 || out.dtype == DType::f16) &&
         readers[static_cast<size_t>(n.outputs[0])].empty() && g.is_root(n.outputs[0]);
}

// The casts `take` accepts (Note [Parameter casts], Note [Update copies]), as one group when there are several, all
// of one output dtype (node ids, ascending); else none.
template <typename Take>
std::vector<int32_t> cast_group(const Graph& g, Take take) {
  std::vector<int32_t> casts;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (take(g.nodes[i])) casts.push_back(static_cast<int32_t>(i));
  const auto out_dtype = [&](int32_t n) {
    return g.values[static_cast<size_t>(g.nodes[static_cast<size_t>(n)].outputs[0])].dtype;
  };
  for (int32_t n : casts)
    if (out_dtype(n) != out_dtype(casts[0])) return {};
  if (casts.size() < 2) casts.clear();
  return casts;
}

// The group of one of node n's producers that n joins (first producer first), or -1: a pointwise node joins a
// group of its own output shape (chain) or, as an epilogue, a reduction group whose row shape it has; a reduction
// takes a pointwise group producing its input as its prologue.
int32_t join_producer_group(const Graph& g, Grouping& gr, int32_t n, FusionKind fk) {
  const Node& node = g.nodes[static_cast<size_t>(n)];
  for (int32_t v : node.inputs) {
    const int32_t p = gr.producer_node(v);
    if (p < 0) continue;
    const int32_t G = gr.group_of[static_cast<size_t>(p)];
    if (G < 0 || gr.kind[static_cast<size_t>(G)] == GroupKind::MultiTensor) continue;
    const Shape& gs = gr.shape[static_cast<size_t>(G)];
    bool fits = false;
    if (fk == FusionKind::Pointwise) {
      fits = same_output_shapes(g, node, gs);
    } else if (!gr.has_reduction[static_cast<size_t>(G)]) {
      const Value& in0 = g.values[static_cast<size_t>(node.inputs[0])];
      fits = in0.producer >= 0 && gr.group_of[static_cast<size_t>(in0.producer)] == G && trace_shape(in0.shape) == gs;
    }
    if (!fits || !gr.can_join(n, G)) continue;
    gr.group_of[static_cast<size_t>(n)] = G;
    if (fk == FusionKind::Reduction) {
      gr.has_reduction[static_cast<size_t>(G)] = true;
      gr.kind[static_cast<size_t>(G)] = GroupKind::RowReduction;
    }
    return G;
  }
  return -1;
}

// Note [Sibling groups merged]: sibling fusion (above) works in node order, so it misses a node that reads a value
// before the group that reads it too exists. The case: a SwiGLU's silu(g) remade in the backward (Note [Saved
// values remade for free], remat.cpp) comes right before the product's gradient dh * silu(g), but the silu gradient
// that reads g comes after it, in the group of dh * u: two kernels, each reading g and dh, instead of one. After
// grouping, a pointwise group merges into an earlier pointwise group of its shape in the same pass that reads one
// of its inputs at full size, when neither reaches the other through nodes outside both (so no cycle results: the
// schedule then runs the merged group as one kernel). Returns how many groups merged away.
int merge_sibling_groups(const Graph& g, Grouping& gr) {
  const std::vector<std::vector<int32_t>> readers = g.readers();
  const size_t ng = gr.first.size();
  std::vector<std::vector<int32_t>> members(ng);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (gr.group_of[i] >= 0) members[static_cast<size_t>(gr.group_of[i])].push_back(static_cast<int32_t>(i));
  // True when a member of A reads a value made outside A and B by a node that reaches B.
  auto reaches = [&](int32_t A, int32_t B) {
    for (int32_t n : members[static_cast<size_t>(A)])
      for (int32_t v : g.nodes[static_cast<size_t>(n)].inputs) {
        const int32_t p = gr.producer_node(v);
        if (p < 0) continue;
        const int32_t P = gr.group_of[static_cast<size_t>(p)];
        if (P != A && P != B && gr.depends_on(p, B)) return true;
      }
    return false;
  };
  auto pointwise = [&](size_t G) { return gr.kind[G] == GroupKind::Pointwise && !members[G].empty(); };
  int merged = 0;
  for (size_t G2 = 0; G2 < ng; ++G2) {
    if (!pointwise(G2)) continue;
    const bool fwd = g.nodes[static_cast<size_t>(members[G2][0])].forward;
    int32_t into = -1;
    for (int32_t n : members[G2]) {
      for (int32_t v : g.nodes[static_cast<size_t>(n)].inputs) {
        if (v < 0 || trace_shape(g.values[static_cast<size_t>(v)].shape) != gr.shape[G2]) continue;
        for (int32_t r : readers[static_cast<size_t>(v)]) {
          const int32_t G1 = gr.group_of[static_cast<size_t>(r)];
          if (G1 < 0 || static_cast<size_t>(G1) >= G2 || !pointwise(static_cast<size_t>(G1)) ||
              gr.shape[static_cast<size_t>(G1)] != gr.shape[G2] || g.nodes[static_cast<size_t>(r)].forward != fwd)
            continue;
          if (reaches(static_cast<int32_t>(G2), G1) || reaches(G1, static_cast<int32_t>(G2))) continue;
          into = G1;
          break;
        }
        if (into >= 0) break;
      }
      if (into >= 0) break;
    }
    if (into < 0) continue;
    for (int32_t n : members[G2]) gr.group_of[static_cast<size_t>(n)] = into;
    auto& dst = members[static_cast<size_t>(into)];
    dst.insert(dst.end(), members[G2].begin(), members[G2].end());
    std::sort(dst.begin(), dst.end());
    gr.first[static_cast<size_t>(into)] = dst.front();
    members[G2].clear();
    ++merged;
  }
  if (merged == 0) return 0;
  // Group ids contiguous again, in their first members' order.
  std::vector<int32_t> id(ng, -1);
  Grouping out(gr.g);
  for (size_t G = 0; G < ng; ++G) {
    if (members[G].empty()) continue;
    id[G] = static_cast<int32_t>(out.first.size());
    out.first.push_back(gr.first[G]);
    out.shape.push_back(gr.shape[G]);
    out.has_reduction.push_back(gr.has_reduction[G]);
    out.kind.push_back(gr.kind[G]);
  }
  for (size_t i = 0; i < g.nodes.size(); ++i)
    out.group_of[i] = gr.group_of[i] < 0 ? -1 : id[static_cast<size_t>(gr.group_of[i])];
  gr.group_of = std::move(out.group_of);
  gr.first = std::move(out.first);
  gr.shape = std::move(out.shape);
  gr.has_reduction = std::move(out.has_reduction);
  gr.kind = std::move(out.kind);
  return merged;
}

// The grouping written into the graph: each node's group, and each group's nodes, boundary values and name.
void materialize_groups(Graph& g, const Grouping& gr) {
  const size_t ngroups = gr.first.size();
  g.groups.resize(ngroups);
  for (size_t G = 0; G < ngroups; ++G) {
    g.groups[G].id = static_cast<int32_t>(G);
    g.groups[G].kind = gr.kind[G];
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const int32_t G = gr.group_of[i];
    g.nodes[i].group = G;
    if (G >= 0) g.groups[static_cast<size_t>(G)].nodes.push_back(static_cast<int32_t>(i));
  }
  std::vector<std::set<int32_t>> readers(g.values.size());  // groups (or -1 - node) reading each value
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (int32_t v : g.nodes[i].inputs)
      if (v >= 0)
        readers[static_cast<size_t>(v)].insert(gr.group_of[i] >= 0 ? gr.group_of[i] : -1 - static_cast<int32_t>(i));
  for (FusionGroup& fg : g.groups) {
    std::set<int32_t> ins, outs;
    for (int32_t n : fg.nodes) {
      for (int32_t v : g.nodes[static_cast<size_t>(n)].inputs) {
        if (v < 0) continue;
        const int32_t p = g.values[static_cast<size_t>(v)].producer;
        if (p < 0 || gr.group_of[static_cast<size_t>(p)] != fg.id) ins.insert(v);
      }
      for (int32_t v : g.nodes[static_cast<size_t>(n)].outputs) {
        bool outside = g.is_root(v);
        for (int32_t r : readers[static_cast<size_t>(v)]) outside = outside || r != fg.id;
        if (outside) outs.insert(v);
      }
    }
    fg.inputs.assign(ins.begin(), ins.end());
    fg.outputs.assign(outs.begin(), outs.end());
    fg.name = group_name(g, fg);
  }
}

}  // namespace

bool fuse(Graph& g, const FuseOptions& o) {
  const bool horizontal = o.horizontal, cuda = o.target.is_cuda();
  g.groups.clear();
  for (Node& n : g.nodes) n.group = -1;
  Grouping gr(g);
  std::vector<std::vector<int32_t>> readers_before(g.values.size());  // nodes seen so far reading each value
  int32_t multi = -1, casts = -1, copies = -1;
  std::vector<int32_t> param_casts, update_copies;
  if (cuda) {
    const std::vector<std::vector<int32_t>> readers = g.readers();
    param_casts = cast_group(g, [&](const Node& n) { return parameter_cast(g, readers, n); });
    update_copies = cast_group(g, [&](const Node& n) { return update_copy(g, readers, n); });
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const int32_t n = static_cast<int32_t>(i);
    const Node& node = g.nodes[i];
    if (i > 0)
      for (int32_t v : g.nodes[i - 1].inputs)
        if (v >= 0) readers_before[static_cast<size_t>(v)].push_back(n - 1);
    if (is_multi_tensor_update(*node.prim)) {
      if (multi < 0 || !horizontal) multi = gr.new_group(n, GroupKind::MultiTensor, {});
      else if (gr.can_join(n, multi)) gr.group_of[i] = multi;
      continue;
    }
    if (std::binary_search(param_casts.begin(), param_casts.end(), n)) {
      // They read only graph inputs, so joining never closes a cycle.
      if (casts < 0) casts = gr.new_group(n, GroupKind::MultiTensor, {});
      else gr.group_of[i] = casts;
      continue;
    }
    if (std::binary_search(update_copies.begin(), update_copies.end(), n)) {  // Note [Update copies]
      if (copies < 0) copies = gr.new_group(n, GroupKind::MultiTensor, {});
      else gr.group_of[i] = copies;
      continue;
    }
    // A whole norm backward is opaque except where one kernel computes it (Note [Column sums in row reductions]).
    const FusionKind fk = cuda && column_sum_norm_bwd(g, node) ? FusionKind::Reduction : node.prim->fusion_kind();
    if (fk != FusionKind::Pointwise && fk != FusionKind::Reduction) continue;
    if (cuda && eager_column_sum(g, node)) continue;
    int32_t joined = join_producer_group(g, gr, n, fk);
    if (joined < 0 && fk == FusionKind::Pointwise) {
      joined = sibling_group(g, gr, readers_before, n);
      if (joined >= 0) gr.group_of[i] = joined;
    }
    if (joined >= 0) continue;
    if (fk == FusionKind::Reduction) {
      const Value& in0 = g.values[static_cast<size_t>(node.inputs[0])];
      gr.new_group(n, GroupKind::RowReduction, trace_shape(in0.shape));
    } else {
      gr.new_group(n, GroupKind::Pointwise, out_shape(g, node));
    }
  }
  merge_sibling_groups(g, gr);
  materialize_groups(g, gr);
  return !g.groups.empty();
}

}  // namespace ingot::compiler::passes
