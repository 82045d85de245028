// Reduced gradients widened piece by piece (invariant: widen_pieces.h).
//
// Note [Gradients widened before their unit is concatenated]
// ZeRO-3 with bf16 weights reduced in f32 (FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32), the
// 8B fine-tune of issue 22) traces each unit's reduction as cast(cat(reshape(grad) ...), f32) (fsdp_compiled.cpp):
// the products write bf16 gradients into the unit's bf16 flat value and one kernel then reads it and writes the
// f32 reduce-scatter input. On the 8B-shaped model that cast moves 1.3 GB per block and step: 32 x ~0.6 ms of the
// 432 ms compiled step on 4x H200, beside the reduce-scatters (bench/RESULTS.md 2026-11-27). A cast of a
// concatenation is the concatenation of its pieces' casts, element for element, so the cast moves to each piece;
// through a reshape (a view) it reaches the op that made the gradient, where the products widen (cuBLASLt writes
// f32 from bf16 operands, matmul_epilogue.h), the norms' column sums take it into their kernels, and
// bucket_views.h then has every piece written straight into the f32 input: no bf16 copy of a unit's gradients and
// no pass over it. A widened product also no longer rounds the gradient to bf16 before the f32 reduction (as
// the DDP step's f32 gradients never were: the compiled step follows eager within bf16 rounding of gradients).
#include "compile/passes/widen_pieces.h"

#include <map>

#include "autograd/ops/attrs.h"
#include "autograd/primitive_collective.h"

namespace ingot::compiler::passes {

namespace {

bool reduction_start(const Primitive& p) {
  const CollectiveStep* c = as_collective(p);
  return c && c->phase() == CollectivePhase::Start &&
         (c->op() == CollectiveOp::AllReduce || c->op() == CollectiveOp::ReduceScatter);
}

bool narrow_float(DType d) { return d == DType::bf16 || d == DType::f16; }

}  // namespace

bool widen_pieces(Graph& g, const WidenPiecesOptions&) {
  const std::vector<int32_t> uses = g.use_counts();
  std::vector<std::vector<size_t>> readers(g.values.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (int32_t v : g.nodes[i].inputs)
      if (v >= 0) readers[static_cast<size_t>(v)].push_back(i);
  std::map<size_t, Node> replace;
  std::map<size_t, std::vector<Node>> before;  // nodes to insert just before node i
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t ci = 0; ci < g.nodes.size(); ++ci) {
    const Node& cast = g.nodes[ci];
    const CastAttrs* to = match<CastAttrs>(*cast.prim);
    if (!to || to->to != DType::f32 || cast.inputs.size() != 1 || cast.outputs.size() != 1) continue;
    const int32_t flat = cast.inputs[0], wide = cast.outputs[0];
    const Value fv = g.values[static_cast<size_t>(flat)];  // a copy: add_value below may reallocate
    if (fv.producer < 0 || !narrow_float(fv.dtype) || fv.shape.size() != 1 || uses[static_cast<size_t>(flat)] != 1 ||
        g.is_root(flat))
      continue;
    bool reduced = false;
    for (size_t r : readers[static_cast<size_t>(wide)]) reduced = reduced || reduction_start(*g.nodes[r].prim);
    if (!reduced) continue;
    const size_t cat_i = static_cast<size_t>(fv.producer);
    const Node& cat = g.nodes[cat_i];
    const CatAttrs* ca = match<CatAttrs>(*cat.prim);
    if (!ca || ca->dim != 0 || replace.count(cat_i) || drop[cat_i]) continue;
    Node wide_cat = cat;
    for (int32_t& piece : wide_cat.inputs) {
      const Value pv = g.values[static_cast<size_t>(piece)];  // a copy: add_value below may reallocate
      if (pv.dtype != fv.dtype) continue;  // not a piece of this dtype (cat checks its inputs alike)
      const Node* reshape = pv.producer >= 0 ? &g.nodes[static_cast<size_t>(pv.producer)] : nullptr;
      const size_t ri = reshape ? static_cast<size_t>(pv.producer) : 0;
      const bool through = reshape && match<ReshapeAttrs>(*reshape->prim) && reshape->inputs.size() == 1 &&
                           reshape->inputs[0] >= 0 && uses[static_cast<size_t>(piece)] == 1 && !g.is_root(piece) &&
                           uses[static_cast<size_t>(reshape->inputs[0])] == 1 &&
                           !g.is_root(reshape->inputs[0]) && !replace.count(ri) && !drop[ri];
      if (through) {
        // cast before the reshape: the reshape (of a value read by nothing else) views the f32 value instead.
        const int32_t src = reshape->inputs[0];
        const Value sv = g.values[static_cast<size_t>(src)];
        const int32_t cast_out = g.add_value(DType::f32, sv.device, sv.shape);
        Node c = cast;
        c.inputs = {src};
        c.outputs = {cast_out};
        c.group = -1;
        Node r = g.nodes[ri];
        r.inputs = {cast_out};
        before[ri].push_back(std::move(c));
        replace[ri] = std::move(r);
        g.values[static_cast<size_t>(piece)].dtype = DType::f32;
      } else {
        const int32_t cast_out = g.add_value(DType::f32, pv.device, pv.shape);
        Node c = cast;
        c.inputs = {piece};
        c.outputs = {cast_out};
        c.group = -1;
        before[cat_i].push_back(std::move(c));
        piece = cast_out;
      }
    }
    wide_cat.outputs = {wide};  // the concatenation makes the f32 value the cast made
    g.values[static_cast<size_t>(wide)].output_index = 0;
    replace[cat_i] = std::move(wide_cat);
    drop[ci] = true;
  }
  if (replace.empty()) return false;
  std::vector<Node> out;
  out.reserve(g.nodes.size() + before.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (auto it = before.find(i); it != before.end())
      for (Node& n : it->second) out.push_back(std::move(n));
    if (drop[i]) continue;
    auto it = replace.find(i);
    out.push_back(it != replace.end() ? std::move(it->second) : std::move(g.nodes[i]));
  }
  g.nodes = std::move(out);
  g.renumber_nodes();
  return true;
}

}  // namespace ingot::compiler::passes
