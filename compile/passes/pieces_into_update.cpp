// The pieces of a narrow wire's sum read by the optimizer update (invariant and Note [Pieces read by the update]:
// pieces_into_update.h).
#include "compile/passes/pieces_into_update.h"

#include "autograd/ops/sum_pieces.h"
#include "autograd/primitive_multi_tensor.h"

namespace ingot::compiler::passes {

bool pieces_into_update(Graph& g, const PiecesIntoUpdateOptions&) {
  const std::vector<int32_t> uses = g.use_counts();
  std::vector<bool> drop(g.nodes.size(), false);
  bool changed = false;
  for (Node& n : g.nodes) {
    const MultiTensorUpdate* update = as_multi_tensor_update(*n.prim);
    if (!update) continue;
    const size_t count = update->tensors(), slots = update->input_slots();
    if (count == 0 || n.inputs.size() != 1 + slots * count) continue;
    // Every gradient (slot 1) a sum of the same number of pieces with the same scale, in f32, read here once (a sum
    // read elsewhere too stays for those readers).
    std::vector<int32_t> sums;
    std::optional<SumPiecesInfo> first;
    for (size_t t = 0; t < count; ++t) {
      const int32_t v = n.inputs[1 + count + t];
      const int32_t p = v >= 0 ? g.values[static_cast<size_t>(v)].producer : -1;
      if (p < 0) break;
      int32_t here = 0;
      for (size_t k = 1; k < n.inputs.size(); ++k) here += n.inputs[k] == v;
      if (here != 1) break;
      const std::optional<SumPiecesInfo> info = as_sum_pieces(*g.nodes[static_cast<size_t>(p)].prim);
      if (!info || info->into != DType::f32 || info->pieces < 2 ||
          (first && (info->pieces != first->pieces || info->scale != first->scale)))
        break;
      first = info;
      sums.push_back(p);
    }
    if (sums.size() != count) continue;
    std::shared_ptr<Primitive> fused = update->with_gradient_pieces(first->pieces, first->scale);
    if (!fused) continue;
    std::vector<int32_t> inputs{n.inputs[0]};
    for (size_t t = 0; t < count; ++t) inputs.push_back(n.inputs[1 + t]);
    for (size_t r = 0; r < first->pieces; ++r)
      for (int32_t s : sums) inputs.push_back(g.nodes[static_cast<size_t>(s)].inputs[r]);
    for (size_t slot = 2; slot < slots; ++slot)
      for (size_t t = 0; t < count; ++t) inputs.push_back(n.inputs[1 + slot * count + t]);
    n.prim = std::move(fused);
    n.inputs = std::move(inputs);
    for (int32_t s : sums) {  // a sum no one else reads goes
      const int32_t v = g.nodes[static_cast<size_t>(s)].outputs[0];
      if (uses[static_cast<size_t>(v)] == 1 && !g.is_root(v)) drop[static_cast<size_t>(s)] = true;
    }
    changed = true;
  }
  if (!changed) return false;
  std::vector<Node> kept;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!drop[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
  g.renumber_nodes();
  return true;
}

}  // namespace ingot::compiler::passes
