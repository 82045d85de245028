// A product added to another product's output accumulates into that output (invariant: accumulate_products.h).
//
// Note [Products accumulated in place]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A LoRA projection's output is its base product plus the adapter's product, and its input gradient is the base
// input-gradient product plus the adapter's. Where that sum meets an elementwise kernel anyway (the residual add, the
// rms_norm backward: `fused:add+add+add+rms_norm_bwd+add`) the add costs nothing of its own, but where it goes
// straight into attention or its backward it is a kernel of its own that reads both [tokens, C] products and writes
// a third. The 8B LoRA step's profile (bf16, 2 x 2048, 32 layers) had 32 x 26 us `fused:add -> [2,2048,4096]` right
// after o_proj's backward products `matmul [4096,4096] x [4096,4096]` and `matmul [4096,8] x [8,4096]`, and
// 32 x 8.5 us `fused:add -> [2,2048,1024]` after v_proj's base and adapter linears in the forward. The matmul kernel
// already computes out = alpha * a @ b + beta * out: with beta = 1 over the other product's output the add is gone,
// and so is one [tokens, C] buffer (matmul_accumulate takes over the other product's buffer when nothing else holds
// it: Note [Outputs over dead inputs], autograd/primitive.h).
//
// What is rewritten: add(P', c') with P' and c' the outputs of products P and Q, each directly or through reshapes
// that nothing else reads, of the add's dtype and shape (no broadcasting). P must be a plain matmul (not widened) or a
// bias-free linear (as matmul(x, w^T)); when both are, P is the one that runs later, so the operands the fused node
// reads at the add's place are kept alive the shortest. The add's value id stays (its readers keep working); P and
// its reshapes go. Only where every reader of the sum, seen through views, is an opaque op or a graph output: an add
// that a pointwise or reduction reader would fuse into its kernel is free already, and the product's accumulation
// would only move it out of that kernel. Both summands must be products so the accumulated buffer is one the product
// kernels wrote (dense, of the add's dtype), which is the case in the profile.
//
// Numerics: f32 and f64 sum the same terms (BLAS adds c into the product's accumulator instead of adding two rounded
// values), equal within rounding; bf16 rounds once (product + c in f32) instead of twice.
#include "compile/passes/accumulate_products.h"

#include <functional>
#include <map>
#include <optional>

#include "autograd/ops/attrs.h"
#include "autograd/ops/matmul_fused.h"

namespace ingot::compiler::passes {
namespace {

struct Accumulate {
  Graph& g;
  std::vector<int32_t> uses;
  std::vector<std::vector<int32_t>> readers;
  std::map<size_t, Node> replace;
  std::vector<bool> drop;

  explicit Accumulate(Graph& graph)
      : g(graph), uses(graph.use_counts()), readers(graph.readers()), drop(graph.nodes.size(), false) {}
  const Value& value(int32_t v) const { return g.values[static_cast<size_t>(v)]; }

  // A summand's product: the producer reached from `v` through reshapes (each value on the way read only once, so
  // the product and the reshapes may go), and the reshape nodes passed.
  struct Chain {
    size_t product = 0;
    std::vector<size_t> views;
  };
  std::optional<Chain> chain_of(int32_t v) const {
    Chain c;
    while (true) {
      if (uses[static_cast<size_t>(v)] != 1 || value(v).producer < 0) return std::nullopt;
      const size_t p = static_cast<size_t>(value(v).producer);
      if (drop[p] || replace.count(p)) return std::nullopt;
      const Node& n = g.nodes[p];
      if (match<ReshapeAttrs>(*n.prim) && n.inputs.size() == 1 && n.inputs[0] >= 0 && n.outputs.size() == 1 &&
          numel(trace_shape(value(n.inputs[0]).shape)) == numel(trace_shape(value(v).shape))) {
        c.views.push_back(p);
        v = n.inputs[0];
        continue;
      }
      if (!product_alpha(*n.prim) || n.outputs.size() != 1) return std::nullopt;
      c.product = p;
      return c;
    }
  }

  // The product the add may accumulate: op(a) @ op(b) computed in the add's dtype. A linear is x @ w^T; only a
  // bias-free one (its bias would be added too).
  struct Flags {
    bool trans_a, trans_b;
    double alpha;
  };
  std::optional<Flags> accumulable(size_t p, DType dtype) const {
    const Node& n = g.nodes[p];
    if (value(n.outputs[0]).dtype != dtype || value(n.inputs[0]).dtype != dtype) return std::nullopt;
    if (const std::optional<MatmulFlags> mf = matmul_flags(*n.prim); mf && !mf->widened)
      return Flags{mf->trans_a, mf->trans_b, mf->alpha};
    if (is_linear(*n.prim) && n.inputs.size() == 3 && n.inputs[2] < 0)
      return Flags{false, true, *product_alpha(*n.prim)};
    return std::nullopt;
  }

  // Every reader of `v`, seen through views, is an op that no generated kernel would take the add into.
  bool read_only_by_opaque_ops(int32_t v) const {
    for (size_t r : readers[static_cast<size_t>(v)]) {
      const Node& n = g.nodes[r];
      const FusionKind k = n.prim->fusion_kind();
      if (k == FusionKind::View) {
        for (int32_t o : n.outputs)
          if (!read_only_by_opaque_ops(o)) return false;
      } else if (k != FusionKind::Opaque) {
        return false;
      }
    }
    return true;
  }

  void rewrite(size_t i) {
    const Node& add = g.nodes[i];
    const BinaryAttrs* b = match<BinaryAttrs>(*add.prim);
    if (!b || b->op != kernels::BinaryOp::Add || add.inputs.size() != 2 || add.outputs.size() != 1) return;
    const Value& out = value(add.outputs[0]);
    for (int32_t in : add.inputs)
      if (in < 0 || value(in).dtype != out.dtype || value(in).shape != out.shape || !(value(in).device == out.device))
        return;
    if (!read_only_by_opaque_ops(add.outputs[0])) return;
    const std::optional<Chain> chains[2] = {chain_of(add.inputs[0]), chain_of(add.inputs[1])};
    if (!chains[0] || !chains[1]) return;
    std::optional<Flags> flags[2] = {accumulable(chains[0]->product, out.dtype),
                                     accumulable(chains[1]->product, out.dtype)};
    // The accumulating product: the later one when both may be.
    int k = -1;
    for (int j = 0; j < 2; ++j)
      if (flags[j] && (k < 0 || chains[j]->product > chains[k]->product)) k = j;
    if (k < 0) return;
    const Node& p = g.nodes[chains[k]->product];
    Node fused = add;
    fused.prim = make_matmul_accumulate(flags[k]->trans_a, flags[k]->trans_b, flags[k]->alpha);
    fused.inputs = {p.inputs[0], p.inputs[1], add.inputs[static_cast<size_t>(1 - k)]};
    drop[chains[k]->product] = true;
    for (size_t v : chains[k]->views) drop[v] = true;
    replace[i] = std::move(fused);
  }
};

}  // namespace

bool accumulate_products(Graph& g, const AccumulateProductsOptions& o) {
  // The add is a generated kernel elsewhere; the rewrite is for the CUDA profile's kernels (or the tests, cpu_too).
  if (!o.target.is_cuda() && !o.cpu_too) return false;
  Accumulate a(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) a.rewrite(i);
  if (a.replace.empty()) return false;
  g.rewrite_nodes(std::move(a.replace), a.drop);
  return true;
}

}  // namespace ingot::compiler::passes
