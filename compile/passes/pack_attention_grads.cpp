// Attention gradients written where the fused qkv projection's backward wants them (invariant:
// pack_attention_grads.h).
//
// Why: a model that projects q, k, v with one linear (GPT-2's c_attn) splits its output, so the split's
// backward concatenates the three gradients. The attention kernels already write each gradient in [B, T, H, D]
// order (Note [Attention layouts]); with the packed output they write straight into the concatenation, and
// its copy of 3 x [B, T, C] per layer is gone (GPT-2 124M at batch 16: 36 copies, 0.7 ms per step on an H100).
#include "compile/passes/pack_attention_grads.h"

#include <map>

#include "autograd/ops/attention_packed.h"
#include "autograd/ops/attrs.h"

namespace ingot::compiler::passes {

bool pack_attention_grads(Graph& g, const PackAttentionGradsOptions&) {
  const std::vector<int32_t> uses = g.use_counts();
  auto producer = [&](int32_t v) -> const Node* {
    const int32_t p = g.values[static_cast<size_t>(v)].producer;
    return p < 0 ? nullptr : &g.nodes[static_cast<size_t>(p)];
  };
  auto index = [&](const Node* n) { return static_cast<int32_t>(n - g.nodes.data()); };
  auto single_use = [&](int32_t v) { return v >= 0 && uses[static_cast<size_t>(v)] == 1; };
  std::map<size_t, Node> replace;  // attention_bwd node index -> its packed replacement
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& cat = g.nodes[i];
    const CatAttrs* along = match<CatAttrs>(*cat.prim);
    if (!along || along->dim != 2 || cat.inputs.size() != 3 || cat.outputs.size() != 1) continue;
    const Value& out = g.values[static_cast<size_t>(cat.outputs[0])];
    if (out.shape.size() != 3) continue;
    const Node* attn = nullptr;
    std::vector<int32_t> chain;  // the permute and reshape node of each piece
    for (size_t k = 0; k < 3; ++k) {
      const int32_t piece = cat.inputs[k];
      const Node* reshape = single_use(piece) ? producer(piece) : nullptr;
      if (!reshape || !match<ReshapeAttrs>(*reshape->prim) || !single_use(reshape->inputs[0])) break;
      const Node* permute = producer(reshape->inputs[0]);
      const PermuteAttrs* perm = permute ? match<PermuteAttrs>(*permute->prim) : nullptr;
      if (!perm || perm->dims != std::vector<int64_t>{0, 2, 1, 3} || !single_use(permute->inputs[0])) break;
      const int32_t grad = permute->inputs[0];
      const Node* a = producer(grad);
      if (!a || !match<AttentionBwdAttrs>(*a->prim) || (attn && a != attn) ||
          g.values[static_cast<size_t>(grad)].output_index != static_cast<int32_t>(k))
        break;
      attn = a;
      chain.push_back(index(reshape));
      chain.push_back(index(permute));
    }
    if (chain.size() != 6) continue;
    const Value& q = g.values[static_cast<size_t>(attn->inputs[1])];
    const Shape qs = trace_shape(q.shape), ks = trace_shape(g.values[static_cast<size_t>(attn->inputs[2])].shape);
    const Shape want{qs[0], qs[2], (qs[1] + 2 * ks[1]) * qs[3]};
    if (q.dtype != out.dtype || trace_shape(out.shape) != want) continue;
    Node packed = *attn;
    packed.prim = packed_attention_bwd(*attn->prim);
    packed.outputs = {cat.outputs[0]};
    g.values[static_cast<size_t>(cat.outputs[0])].output_index = 0;
    replace[static_cast<size_t>(index(attn))] = std::move(packed);
    for (int32_t n : chain) drop[static_cast<size_t>(n)] = true;
    drop[i] = true;
  }
  if (replace.empty()) return false;
  g.rewrite_nodes(std::move(replace), drop);
  return true;
}

}  // namespace ingot::compiler::passes
