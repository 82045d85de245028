// A scalar multiply whose result only products read becomes those products' alpha (invariant:
// scale_into_products.h).
//
// Note [Scales folded into products]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// LoRA scales its rank-r activation, h = (alpha / r) * (x A^T) (autograd/nn/lora.cpp: the scalar product keeps r
// columns, not the update's [.., out]), and the backward scales dh the same way. Every reader of the scaled value is
// a matrix product: the B product in the forward (through the split of the shared A-product's [.., 3r] result for
// q, k and v: Note [Adapters of one input], autograd/nn/lora.h) and B's weight gradient, which reads the saved h; in
// the backward, A's weight-gradient and input-gradient products, which read the scaled dh. The multiply is a kernel
// of its own that the products could do for free: the matmul kernel computes alpha * a @ b. The 8B LoRA step's
// profile (bf16, 2 x 2048, 32 layers) had 64 x 4.7 us `fused:mul_scalar -> [2,2048,24]` (q/k/v's shared h and dh)
// and 64 x 4.4 us `fused:mul_scalar -> [2,2048,8]` (o_proj's).
//
// What is rewritten: y = mul_scalar(x, s) of a floating x into x's dtype whose result, through single-input views
// only (reshape, permute, split, slice, expand: a view of x * s is the view of x times s), is read only as operand a or
// b of matmul (widened or not), bias-free linear or matmul_accumulate nodes, and no value of those is a graph output,
// write-back, gradient or bucket placement. The multiply goes, its readers read x, and each product's alpha is
// multiplied by s once per operand it reads from the scaled value (x^T x reads it twice: s^2). A linear with a bias
// does not qualify: the bias kernel (cuBLASLt's bias epilogue) cannot scale the product apart from the bias.
//
// Numerics: the product is scaled in its f32 (f64) accumulator instead of its rounded operand: for bf16 one rounding
// of h less; f32 and f64 equal within rounding.
#include "compile/passes/scale_into_products.h"

#include <map>

#include "autograd/ops/attrs.h"
#include "autograd/ops/matmul_fused.h"

namespace ingot::compiler::passes {
namespace {

struct Scales {
  Graph& g;
  std::vector<std::vector<int32_t>> readers;
  std::vector<bool> drop;

  explicit Scales(Graph& graph) : g(graph), readers(graph.readers()), drop(graph.nodes.size(), false) {}

  // Adds to `operands` each product reading `v` (or a view of it) and how many of its operands do; false when
  // anything else reads it or a value on the way must hold the scaled elements (a root, a placed value).
  bool products_reading(int32_t v, std::map<size_t, int>& operands) const {
    if (g.is_root(v) || g.values[static_cast<size_t>(v)].placed_in >= 0) return false;
    for (size_t r : readers[static_cast<size_t>(v)]) {
      const Node& n = g.nodes[r];
      if (n.prim->fusion_kind() == FusionKind::View) {
        if (n.inputs.size() != 1) return false;
        for (int32_t o : n.outputs)
          if (!products_reading(o, operands)) return false;
        continue;
      }
      if (!product_alpha(*n.prim) || (is_linear(*n.prim) && n.inputs.size() > 2 && n.inputs[2] >= 0)) return false;
      for (size_t j = 0; j < n.inputs.size(); ++j) {
        if (n.inputs[j] != v) continue;
        if (j >= 2) return false;  // matmul_accumulate's c: not a factor of the product
        ++operands[r];
      }
    }
    return true;
  }

  bool fold(size_t i) {
    const Node& mul = g.nodes[i];
    const UnaryAttrs* u = match<UnaryAttrs>(*mul.prim);
    if (!u || u->op != kernels::UnaryOp::MulScalar || mul.inputs.size() != 1 || mul.outputs.size() != 1 ||
        mul.inputs[0] < 0)
      return false;
    const int32_t x = mul.inputs[0], y = mul.outputs[0];
    const Value &xv = g.values[static_cast<size_t>(x)], &yv = g.values[static_cast<size_t>(y)];
    if (!is_floating(xv.dtype) || yv.dtype != xv.dtype) return false;
    std::map<size_t, int> operands;
    if (!products_reading(y, operands) || operands.empty()) return false;
    for (auto [r, count] : operands) {
      Node& n = g.nodes[r];
      for (int c = 0; c < count; ++c) n.prim = scaled_product(*n.prim, u->alpha);
    }
    g.replace_uses(y, x);
    drop[i] = true;
    return true;
  }
};

}  // namespace

bool scale_into_products(Graph& g, const ScaleIntoProductsOptions& o) {
  // Elsewhere the multiply fuses into a generated kernel; the rewrite is for the CUDA profile's kernels (or the
  // tests, cpu_too).
  if (!o.target.is_cuda() && !o.cpu_too) return false;
  // In node order, so a multiply's readers are what the graph had: folding one moves only its own readers onto
  // its input, an earlier value that no later multiply's readers include.
  Scales s(g);
  bool changed = false;
  for (size_t i = 0; i < g.nodes.size(); ++i) changed |= s.fold(i);
  if (!changed) return false;
  g.rewrite_nodes({}, s.drop);
  return true;
}

}  // namespace ingot::compiler::passes
