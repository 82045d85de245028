// Reduced gradients cast piece by piece (invariant: cast_pieces.h).
//
// Note [Gradients cast before their bucket is concatenated]
// A data-parallel step whose gradients are reduced in another dtype than they are made in traces each bucket (DDP,
// distributed/ddp.cpp) or unit (ZeRO-3, distributed/fsdp_compiled.cpp) as cast(cat(reshape(grad) ...), dtype): the
// gradients are written into a flat value of their own dtype and one kernel then reads it whole and writes the
// reduction's input. Two cases:
// - bf16 weights reduced in f32 (FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32); the 8B
//   fine-tune of issue 22): on the 8B-shaped model that cast moved 1.3 GB per block and step, 32 x ~0.6 ms of the
//   432 ms compiled step on 4x H200 (bench/RESULTS.md 2026-11-27). Moved onto each piece and through its reshape,
//   the cast reaches the product that made the gradient, which writes f32 itself (matmul_epilogue.h's widened
//   product: no bf16 rounding of the gradient before the f32 reduction, 3-4% on the product); the step ran 3.1%
//   faster.
// - f32 weights under bf16 autocast reduced in bf16 (DDP's reduce_dtype, PyTorch's bf16 compress hook): each
//   weight gradient is a bf16 product widened by autocast's backward, then narrowed again with its bucket. Moved
//   onto the piece, the narrowing cast meets the widening one: bf16 -> f32 -> bf16 is exact, so both go and the
//   product writes the bf16 bucket; the reduction then moves half the bytes with no cast kernel before it.
// A cast of a concatenation is the concatenation of its pieces' casts element for element, so nothing changes
// numerically beyond what the widened products keep (the compiled step follows eager within bf16 rounding).
#include "compile/passes/cast_pieces.h"

#include <map>

#include "autograd/ops/attrs.h"
#include "autograd/primitive_collective.h"

namespace ingot::compiler::passes {

namespace {

bool narrow_float(DType d) { return d == DType::bf16 || d == DType::f16; }

// Whether a cast between these dtypes is one this pass moves: f32 from bf16 / f16 or back.
bool moved_cast(DType from, DType to) {
  return (from == DType::f32 && narrow_float(to)) || (narrow_float(from) && to == DType::f32);
}

struct Rewrite {
  Graph& g;
  std::vector<int32_t> uses;
  std::vector<std::vector<int32_t>> readers;
  std::map<size_t, Node> replace;
  std::map<size_t, std::vector<Node>> before;  // nodes to insert just before node i
  std::vector<bool> drop;

  explicit Rewrite(Graph& graph)
      : g(graph), uses(graph.use_counts()), readers(graph.readers()), drop(graph.nodes.size(), false) {}

  bool free_node(size_t i) const { return !replace.count(i) && !drop[i]; }

  // The value `v` (read only by the node being rewritten) in dtype `to`: when v is a cast from `to` itself
  // (exact, as the widening of a bf16 value), that value, its cast dropped; else a new cast of v (a copy of the
  // cast node `proto`) inserted before node `at`.
  int32_t cast_of(int32_t v, DType to, const Node& proto, size_t at) {
    const Value val = g.values[static_cast<size_t>(v)];  // a copy: add_value below may reallocate
    if (val.producer >= 0 && uses[static_cast<size_t>(v)] == 1 && !g.is_root(v)) {
      const size_t pi = static_cast<size_t>(val.producer);
      const Node& p = g.nodes[pi];
      const CastAttrs* c = match<CastAttrs>(*p.prim);
      if (c && free_node(pi) && p.inputs.size() == 1 && p.inputs[0] >= 0 &&
          g.values[static_cast<size_t>(p.inputs[0])].dtype == to && val.dtype == DType::f32) {
        drop[pi] = true;
        return p.inputs[0];
      }
    }
    const int32_t out = g.add_value(to, val.device, val.shape);
    Node c = proto;
    c.inputs = {v};
    c.outputs = {out};
    c.group = -1;
    before[at].push_back(std::move(c));
    return out;
  }

  void piece(int32_t& piece, DType to, const Node& cast, size_t cat_i) {
    const Value pv = g.values[static_cast<size_t>(piece)];
    if (pv.producer >= 0 && uses[static_cast<size_t>(piece)] == 1 && !g.is_root(piece)) {
      const size_t ri = static_cast<size_t>(pv.producer);
      const Node& reshape = g.nodes[ri];
      if (match<ReshapeAttrs>(*reshape.prim) && reshape.inputs.size() == 1 && reshape.inputs[0] >= 0 &&
          uses[static_cast<size_t>(reshape.inputs[0])] == 1 && !g.is_root(reshape.inputs[0]) && free_node(ri)) {
        // Cast before the reshape: the reshape (of a value read by nothing else) views the cast value instead.
        Node r = reshape;
        r.inputs = {cast_of(reshape.inputs[0], to, cast, ri)};
        replace[ri] = std::move(r);
        g.values[static_cast<size_t>(piece)].dtype = to;
        return;
      }
    }
    piece = cast_of(piece, to, cast, cat_i);
  }
};

}  // namespace

bool cast_pieces(Graph& g, const CastPiecesOptions&) {
  Rewrite rw(g);
  for (size_t ci = 0; ci < g.nodes.size(); ++ci) {
    const Node& cast = g.nodes[ci];
    const CastAttrs* to = match<CastAttrs>(*cast.prim);
    if (!to || cast.inputs.size() != 1 || cast.outputs.size() != 1 || !rw.free_node(ci)) continue;
    const int32_t flat = cast.inputs[0], out = cast.outputs[0];
    const Value fv = g.values[static_cast<size_t>(flat)];  // a copy: add_value may reallocate
    if (fv.producer < 0 || !moved_cast(fv.dtype, to->to) || fv.shape.size() != 1 ||
        rw.uses[static_cast<size_t>(flat)] != 1 || g.is_root(flat))
      continue;
    bool reduced = false;
    for (size_t r : rw.readers[static_cast<size_t>(out)]) reduced = reduced || is_reduction_start(*g.nodes[r].prim);
    if (!reduced) continue;
    const size_t cat_i = static_cast<size_t>(fv.producer);
    const CatAttrs* ca = match<CatAttrs>(*g.nodes[cat_i].prim);
    if (!ca || ca->dim != 0 || !rw.free_node(cat_i)) continue;
    Node cat = g.nodes[cat_i];
    // Pieces of other dtypes (cat promotes them) would come out of their casts unpromoted: left alone (DDP's and
    // ZeRO's buckets and units hold one dtype).
    bool one_dtype = true;
    for (int32_t p : cat.inputs) one_dtype = one_dtype && p >= 0 && g.values[static_cast<size_t>(p)].dtype == fv.dtype;
    if (!one_dtype) continue;
    for (int32_t& p : cat.inputs) rw.piece(p, to->to, cast, cat_i);
    cat.outputs = {out};  // the concatenation makes the value the cast made
    g.values[static_cast<size_t>(out)].output_index = 0;
    rw.replace[cat_i] = std::move(cat);
    rw.drop[ci] = true;
  }
  if (rw.replace.empty()) return false;
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size() + rw.before.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (auto it = rw.before.find(i); it != rw.before.end())
      for (Node& n : it->second) nodes.push_back(std::move(n));
    if (rw.drop[i]) continue;
    auto it = rw.replace.find(i);
    nodes.push_back(it != rw.replace.end() ? std::move(it->second) : std::move(g.nodes[i]));
  }
  g.nodes = std::move(nodes);
  g.renumber_nodes();
  return true;
}

}  // namespace ingot::compiler::passes
