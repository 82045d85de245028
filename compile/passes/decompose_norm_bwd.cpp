// Splitting the norm backward (invariant: decompose_norm_bwd.h).
//
// Note [Norm backward decomposition]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The eager norm backward is one fused kernel writing dx, dw and db. In a compiled training step it is
// surrounded by pointwise work: dy arrives as a cast of the bf16 matmul gradient, and dx is added to the
// residual stream's gradient and cast back to bf16. As an opaque op it pins all of that into separate
// kernels, each a full pass over [B, T, C]. Split in two, each half is a plain reduction the fuser knows:
//   - dx reduces over each row (the last dim): one RowReduction kernel that takes the cast of dy as its
//     prologue and the residual add and cast as its epilogue;
//   - dw/db reduce over every row (the leading dims): a RowReduction with the dims transposed to [C, rows],
//     which the CUDA backend runs as a split column reduction.
// The price is a second read of dy and x; what it saves is the f32 round trips of dy, dx and the residual
// sum. The fuser never duplicates a node, so a cast of dy feeding both halves would be stored in f32 for
// the second one; giving the dw/db half its own copy lets each kernel fold the cast in. The pass runs after
// the last CSE, which would merge the copy back. A half whose group does not lower runs the eager kernel
// with its flags, so the split never costs correctness.
// On CUDA the node is not split: its dx kernel sums dw and db as it goes (column sums, see column_sum_norm_bwd), so
// dy and x are read once, with the same prologue and epilogue fusion.
#include "compile/passes/decompose_norm_bwd.h"

#include "autograd/ops/norm.h"
#include "compile/codegen/cuda/render_cuda.h"

namespace ingot::compiler::passes {

// Note [Column sums in row reductions] (compile/codegen/cuda/render_cuda_rows.cpp): on CUDA the dx kernel also sums
// dw and db, so the node stays whole when at least kMinWarps warps' shared rows fit the 48 KB of a block. Each
// warp holds one padded row per sum (cols + cols / width + 1 floats, render_cuda.h's column_sum_row; 1.25 x cols
// at worst, for f32 vectors). Measured faster than the split: GPT-2's 768 columns with dw and db (7 warps per
// block) and a ~1B Llama's 2048 with dw (4 warps). Wider rows (4096 with dw: 2 warps) keep the split, whose
// kernels run at full occupancy, until measured.
bool column_sum_norm_bwd(const Graph& g, const Node& n) {
  constexpr int64_t kMinWarps = 4;
  const std::optional<NormBwdFlags> flags = norm_bwd_flags(*n.prim);
  if (!flags || !flags->dx || !(flags->dw || flags->db)) return false;
  const NormBwdFlags& f = *flags;
  const Value& dy = g.values[static_cast<size_t>(n.inputs[0])];
  const Value& x = g.values[static_cast<size_t>(n.inputs[1])];
  if (!x.device.is_cuda() || x.dtype == DType::f64 || dy.dtype == DType::f64) return false;
  const Shape s = trace_shape(x.shape);
  if (s.size() < 2 || s.back() <= 0) return false;
  const int64_t sums = (f.dw ? 1 : 0) + (f.db ? 1 : 0);
  // The widest padding the launcher can use: f32 vectors of 4.
  const int64_t row_floats = codegen::cuda::column_sum_row(s.back(), 4);
  return kMinWarps * sums * row_floats * 4 <= codegen::cuda::kColumnSumSharedBytes;
}

bool decompose_norm_bwd(Graph& g, const DecomposeNormBwdOptions& o) {
  const bool cuda = o.target.is_cuda();
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size());
  bool changed = false;
  for (const Node& n : g.nodes) {
    const std::optional<NormBwdFlags> f = norm_bwd_flags(*n.prim);
    if (!f || !f->dx || !(f->dw || f->db) || (cuda && column_sum_norm_bwd(g, n))) {
      nodes.push_back(n);
      continue;
    }
    changed = true;
    Node dx = n;
    dx.prim = make_norm_bwd(f->centered, true, false, false);
    dx.outputs = {n.outputs[0]};
    Node params = n;
    params.prim = make_norm_bwd(f->centered, false, f->dw, f->db);
    params.outputs.assign(n.outputs.begin() + 1, n.outputs.end());
    for (size_t k = 0; k < params.outputs.size(); ++k)
      g.values[static_cast<size_t>(params.outputs[k])].output_index = static_cast<int32_t>(k);
    nodes.push_back(std::move(dx));
    const int32_t dy = n.inputs[0];
    const int32_t p = g.values[static_cast<size_t>(dy)].producer;
    if (p >= 0) {
      const Node& prod = g.nodes[static_cast<size_t>(p)];
      if (prod.prim->fusion_kind() == FusionKind::Pointwise && prod.inputs.size() == 1 && prod.outputs.size() == 1) {
        const Value v = g.values[static_cast<size_t>(dy)];
        Node copy = prod;
        copy.forward = n.forward;
        copy.group = -1;
        copy.outputs = {g.add_value(v.dtype, v.device, v.shape)};
        params.inputs[0] = copy.outputs[0];
        nodes.push_back(std::move(copy));
      }
    }
    nodes.push_back(std::move(params));
  }
  if (!changed) return false;
  g.nodes = std::move(nodes);
  g.renumber_nodes();
  return true;
}

}  // namespace ingot::compiler::passes
