// Algebraic simplification and constant folding (invariant: simplify.h). Identity removal is sound because the
// graph is pure: a buffer is never written after it is made (the executor copies roots that alias captured
// tensors).
#include "compile/passes/simplify.h"

#include "compile/lower/lowering.h"

namespace ingot::compiler::passes {

bool simplify(Graph& g, const SimplifyOptions& o) {
  const int64_t fold_limit = o.fold_limit_elems;
  bool changed = false;
  std::vector<Node> kept;
  for (Node& node : g.nodes) {
    std::vector<TensorMeta> in, out;
    bool all_const = !node.inputs.empty();
    for (int32_t i : node.inputs) {
      if (i < 0) {
        in.push_back({});
        continue;
      }
      const Value& v = g.values[static_cast<size_t>(i)];
      in.push_back({trace_shape(v.shape), v.dtype, v.device});
      all_const = all_const && v.producer < 0 && g.inputs[static_cast<size_t>(v.input_index)].role == InputRole::Constant;
    }
    int64_t out_elems = 0;
    bool symbolic = false;
    for (int32_t o : node.outputs) {
      const Value& v = g.values[static_cast<size_t>(o)];
      out.push_back({trace_shape(v.shape), v.dtype, v.device});
      out_elems += numel(out.back().shape);
      for (const Dim& d : v.shape) symbolic = symbolic || d.is_symbolic();
    }
    if (auto k = identity_input(*node.prim, in, out); k && node.inputs[*k] >= 0) {
      g.replace_uses(node.outputs[0], node.inputs[*k]);
      changed = true;
      continue;
    }
    if (all_const && !symbolic && out_elems <= fold_limit) {
      std::vector<Tensor> args;
      for (int32_t i : node.inputs)
        args.push_back(i >= 0 ? g.inputs[static_cast<size_t>(g.values[static_cast<size_t>(i)].input_index)].tensor : Tensor());
      std::vector<Tensor> res;
      {
        NoGradGuard ng;
        res = node.prim->eval(args);
      }
      for (size_t k = 0; k < res.size(); ++k) {
        const int32_t c = g.add_input(InputRole::Constant, res[k].dtype(), res[k].device(),
                                      concrete_shape(res[k].shape()), "folded " + std::string(node.prim->name()));
        g.inputs.back().tensor = res[k].contiguous_raw();
        g.replace_uses(node.outputs[k], c);
      }
      changed = true;
      continue;
    }
    kept.push_back(std::move(node));
  }
  g.nodes = std::move(kept);
  if (changed) g.renumber_nodes();
  return changed;
}

}  // namespace ingot::compiler::passes
