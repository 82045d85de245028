// A LoRA branch's scale and sum folded into its matrix product (invariant: lora_epilogue.h).
//
// Note [LoRA epilogue]
// ~~~~~~~~~~~~~~~~~~~~
// An adapted projection is y = base(x) + B(s * A(x)) (autograd/nn/lora.cpp): in the forward the add reads the
// [tokens, out] output of B's product, and in the backward the input gradient dx_base + dA(x) is another add of a
// full-size product, while s * (dy @ B) is a mul_scalar of a product. Each add is a separate pass over two
// [tokens, out] values (8B LoRA on an H100: 128 adds of 32.6 us per step), each scale a separate kernel. The
// matmul kernels compute out = alpha * op(a) @ op(b) + beta * out (cuBLASLt's D = alpha * A·B + beta * C with
// D = C; OpenBLAS's gemm), so the product takes the scale as alpha and the sum as beta = 1 over the other
// value's buffer, written in place when nothing reads that value later (Note [Outputs over dead inputs]).
// Numerics: the product is rounded once instead of after the product, the scale and the add; the result stays
// within the compiled-vs-eager tolerance of its dtype. Casts end a chain: the product keeps its dtype.
#include "compile/passes/lora_epilogue.h"

#include <map>
#include <optional>

#include "autograd/ops/attrs.h"
#include "autograd/ops/matmul_fused.h"

namespace ingot::compiler::passes {

namespace {

// A product reached from a value through reshapes and mul_scalars, each read only along the way.
struct Chain {
  size_t product;              // the matmul / linear node
  std::vector<size_t> between;  // the reshapes and mul_scalars after it
  bool trans_a, trans_b;
  double alpha = 1.0;
};

struct Folder {
  Graph& g;
  std::vector<int32_t> uses;
  std::map<size_t, Node> replace;
  std::vector<bool> drop;

  explicit Folder(Graph& graph) : g(graph), uses(graph.use_counts()), drop(graph.nodes.size(), false) {}

  const Value& value(int32_t v) const { return g.values[static_cast<size_t>(v)]; }
  bool taken(size_t n) const { return drop[n] || replace.count(n); }

  // The product behind `v`, or nullopt: every value on the way read once, the product's 2-D operands and its
  // output of v's dtype (no cast in between), nothing on the way already rewritten.
  std::optional<Chain> chain_from(int32_t v) const {
    Chain c{};
    const DType dtype = value(v).dtype;
    for (int depth = 0; depth < 4; ++depth) {
      const int32_t p = value(v).producer;
      if (p < 0 || uses[static_cast<size_t>(v)] != 1 || taken(static_cast<size_t>(p)) || value(v).dtype != dtype)
        return std::nullopt;
      const Node& n = g.nodes[static_cast<size_t>(p)];
      if (n.outputs.size() != 1) return std::nullopt;
      const UnaryAttrs* u = match<UnaryAttrs>(*n.prim);
      if (match<ReshapeAttrs>(*n.prim) || (u && u->op == kernels::UnaryOp::MulScalar)) {
        if (u) c.alpha *= u->alpha;
        c.between.push_back(static_cast<size_t>(p));
        v = n.inputs[0];
        continue;
      }
      bool ta = false, tb = true;  // linear: x @ w^T
      if (const std::optional<MatmulFlags> mf = matmul_flags(*n.prim)) {
        if (!n.prim->differentiable()) return std::nullopt;  // a widened product writes f32
        ta = mf->trans_a;
        tb = mf->trans_b;
      } else if (!is_linear(*n.prim) || (n.inputs.size() > 2 && n.inputs[2] >= 0)) {
        return std::nullopt;
      }
      if (trace_shape(value(n.inputs[0]).shape).size() != 2 || trace_shape(value(n.inputs[1]).shape).size() != 2 ||
          value(n.inputs[0]).dtype != dtype || value(n.inputs[1]).dtype != dtype)
        return std::nullopt;
      c.product = static_cast<size_t>(p);
      c.trans_a = ta;
      c.trans_b = tb;
      return c;
    }
    return std::nullopt;
  }

  // Whether `v` is, through reshapes, a mul_scalar's output: a LoRA branch's product reads the scaled rank-r
  // activation (forward: B(s * A(x)); backward: (s * (dy @ B)) @ A). Only those sums fold: a model's own residual
  // add of a projection keeps its rounding, so a bf16 model's compiled step stays where it was against eager.
  bool scaled_operand(int32_t v) const {
    for (int depth = 0; depth < 4 && v >= 0 && value(v).producer >= 0; ++depth) {
      const Node& n = g.nodes[static_cast<size_t>(value(v).producer)];
      const UnaryAttrs* u = match<UnaryAttrs>(*n.prim);
      if (u && u->op == kernels::UnaryOp::MulScalar) return true;
      if (!match<ReshapeAttrs>(*n.prim)) return false;
      v = n.inputs[0];
    }
    return false;
  }

  // `at` becomes alpha * product (+ base): the product and the nodes between are dropped.
  void fold(size_t at, const Chain& c, int32_t base) {
    const Node& p = g.nodes[c.product];
    Node fused = g.nodes[at];
    const int32_t out = fused.outputs[0];
    fused.prim = make_matmul_scaled(c.trans_a, c.trans_b, c.alpha, base >= 0, trace_shape(value(out).shape));
    fused.inputs = {p.inputs[0], p.inputs[1]};
    if (base >= 0) fused.inputs.push_back(base);
    replace[at] = std::move(fused);
    drop[c.product] = true;
    for (size_t b : c.between) drop[b] = true;
  }

  // add(base, chain) -> matmul_scaled accumulating into base.
  void sums() {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& add = g.nodes[i];
      const BinaryAttrs* b = match<BinaryAttrs>(*add.prim);
      if (!b || b->op != kernels::BinaryOp::Add || add.inputs.size() != 2 || add.outputs.size() != 1 || taken(i))
        continue;
      const Value& out = value(add.outputs[0]);
      for (int k = 1; k >= 0; --k) {  // the second operand first: LoRA's update is added to the base's output
        const int32_t base = add.inputs[static_cast<size_t>(1 - k)], other = add.inputs[static_cast<size_t>(k)];
        const Value &bv = value(base), &ov = value(other);
        // The product writes its operands' dtype into the base's buffer: an add that promotes (a bf16 product
        // added to an f32 value) would need a widened product, which this pass does not make.
        if (base == other || bv.dtype != out.dtype || ov.dtype != out.dtype || bv.shape != out.shape ||
            ov.shape != out.shape || !(bv.device == out.device))
          continue;
        // A base made by an earlier fold (add(add(p, q1), q2): the input gradient of q, k and v) keeps its value.
        if (bv.producer >= 0 && drop[static_cast<size_t>(bv.producer)]) continue;
        const std::optional<Chain> c = chain_from(other);
        if (c && scaled_operand(g.nodes[c->product].inputs[0])) {
          fold(i, *c, base);
          break;
        }
      }
    }
  }

  // mul_scalar(chain) -> matmul_scaled with the scalar as alpha.
  void scales() {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& mul = g.nodes[i];
      const UnaryAttrs* u = match<UnaryAttrs>(*mul.prim);
      if (!u || u->op != kernels::UnaryOp::MulScalar || mul.outputs.size() != 1 || taken(i)) continue;
      if (value(mul.inputs[0]).dtype != value(mul.outputs[0]).dtype) continue;
      if (std::optional<Chain> c = chain_from(mul.inputs[0])) {
        c->alpha *= u->alpha;
        fold(i, *c, -1);
      }
    }
  }
};

}  // namespace

bool lora_epilogue(Graph& g, const LoraEpilogueOptions&) {
  Folder f(g);
  f.sums();
  f.scales();
  if (f.replace.empty()) return false;
  g.rewrite_nodes(std::move(f.replace), f.drop);
  return true;
}

}  // namespace ingot::compiler::passes
