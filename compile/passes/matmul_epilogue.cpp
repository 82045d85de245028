// Folding the GELU and its backward into the matrix products next to them (invariant: matmul_epilogue.h).
//
// Note [cuBLASLt GELU backward epilogue]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In a GPT block's backward, the gradient of the MLP's hidden activation is dh = dy @ W2 (a matmul), then
// gelu_tanh_grad(pre, dh) (a pass over [tokens, 4C] reading pre and dh and writing the result), then the
// first linear's bias gradient sum(dpre, dims=[0]) (another pass). cuBLASLt's DGELU_BGRAD epilogue does the
// last two while the product's tile is still in registers: it reads pre once, writes dpre once and the
// column sums, and dh never exists. The pass keeps the GELU gradient's value id (so its other readers, the
// dgrad and wgrad products of the first linear, read the fused node's output) and the sum's value id.
// Measured on an H100 (cuBLASLt of CUDA 13, bf16, GPT-2 b16, bench/RESULTS.md 2026-11-23): DGELU alone runs
// fused (12 x 170 us, against 12 x 122 us product + 12 x 104 us GELU gradient before), but DGELU_BGRAD runs
// the product and then a separate generic epilogue kernel (12 x 347 us): 36.1 vs 39.0 ms per step. So the
// CUDA kernel never asks cuBLASLt for it: where its own Hopper kernel (runtime/kernels/cuda/gemm_sm90.cu) takes
// the product, that sums the columns in its epilogue (partial sums per 128-row block, then one small kernel);
// elsewhere DGELU runs and then a column sum. The pipeline fuses the bias gradient too (with_dbias): on an H200
// (GPT-2 b16, reduce-overhead) that took the c_fc bias gradient's separate pass over the 100 MB GELU gradient
// out of each layer's backward (bench/RESULTS.md, 2026-11-24 fifth session).
#include "compile/passes/matmul_epilogue.h"

#include <map>

#include "autograd/ops/attrs.h"
#include "autograd/ops/matmul_fused.h"
#include "autograd/ops/reduce_fused.h"
#include "compile/passes/fuse.h"

namespace ingot::compiler::passes {

namespace {

// The three rewrites' shared view of the graph: readers and use counts from before any rewrite, and the
// replacements and removals they have decided so far (applied together by rewrite_nodes).
struct Epilogues {
  Graph& g;
  const MatmulEpilogueOptions& o;
  std::vector<int32_t> uses;
  std::vector<std::vector<int32_t>> readers;
  std::map<size_t, Node> replace;  // node index -> the node that takes its place
  std::vector<bool> drop;

  Epilogues(Graph& graph, const MatmulEpilogueOptions& options)
      : g(graph), o(options), uses(graph.use_counts()), readers(graph.readers()), drop(graph.nodes.size(), false) {}
  const Node* producer(int32_t v) const {
    const int32_t p = g.values[static_cast<size_t>(v)].producer;
    return p < 0 ? nullptr : &g.nodes[static_cast<size_t>(p)];
  }
  Shape shape(int32_t v) const { return trace_shape(g.values[static_cast<size_t>(v)].shape); }
  // Whether a product writing `v` may take an epilogue: on CUDA (or cpu_too) and in a float dtype.
  bool fusable(const Value& v) const {
    if (!o.cpu_too && !v.device.is_cuda()) return false;
    return v.dtype == DType::bf16 || v.dtype == DType::f16 || v.dtype == DType::f32;
  }

  // The bias gradient next to a GELU gradient `out` seen as [M, N] (shape ms): the output of sum(reshape(out),
  // dims=[0]) in `dtype` and its node, or -1.
  std::pair<int32_t, size_t> bias_gradient(int32_t out, const Shape& ms, DType dtype) const {
    for (size_t r : readers[static_cast<size_t>(out)]) {
      const Node& rn = g.nodes[r];
      if (!match<ReshapeAttrs>(*rn.prim) || shape(rn.outputs[0]) != ms) continue;
      for (size_t s : readers[static_cast<size_t>(rn.outputs[0])]) {
        const Node& sn = g.nodes[s];
        const ReduceAttrs* a = match<ReduceAttrs>(*sn.prim);
        if (a && a->op == kernels::ReduceOp::Sum && a->dims == std::vector<int64_t>{0} && !a->keepdim &&
            !a->widened && g.values[static_cast<size_t>(sn.outputs[0])].dtype == dtype && !drop[s])
          return {sn.outputs[0], s};
      }
    }
    return {-1, 0};
  }

  // Note [cuBLASLt GELU backward epilogue]: gelu_tanh_grad(pre, [reshape](matmul(a, b))), the product read only
  // there, becomes matmul_dgelu (with the bias gradient when with_dbias finds it).
  void backward_gelus() {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& gelu = g.nodes[i];
      const BinaryAttrs* grad = match<BinaryAttrs>(*gelu.prim);
      if (!grad || grad->op != kernels::BinaryOp::GeluTanhGrad || gelu.outputs.size() != 1) continue;
      const int32_t pre = gelu.inputs[0], out = gelu.outputs[0];
      const Value& pv = g.values[static_cast<size_t>(pre)];
      if (!fusable(pv)) continue;
      // dh = [reshape](matmul(a, b)), each read only here.
      int32_t dh = gelu.inputs[1];
      const Node* p = producer(dh);
      const Node* reshape = nullptr;
      if (p && match<ReshapeAttrs>(*p->prim) && uses[static_cast<size_t>(dh)] == 1) {
        reshape = p;
        dh = p->inputs[0];
        p = producer(dh);
      }
      if (!p || uses[static_cast<size_t>(dh)] != 1) continue;
      const std::optional<MatmulFlags> mf = matmul_flags(*p->prim);
      // matmul_dgelu has no alpha: a product carrying a folded scale (scale_into_products) stays.
      if (!mf || mf->alpha != 1.0 || shape(p->inputs[0]).size() != 2 || shape(p->inputs[1]).size() != 2) continue;
      const Shape ms = shape(dh);
      if (g.values[static_cast<size_t>(dh)].dtype != pv.dtype || numel(ms) != numel(shape(pre))) continue;
      // The bias gradient: sum over the rows of the GELU gradient seen as [M, N].
      const auto [dbias, sum_node] =
          o.with_dbias ? bias_gradient(out, ms, pv.dtype) : std::pair<int32_t, size_t>{-1, 0};
      Node fused = gelu;
      fused.prim = make_matmul_dgelu(mf->trans_a, mf->trans_b, dbias >= 0);
      fused.inputs = {p->inputs[0], p->inputs[1], pre};
      fused.outputs = {out};
      if (dbias >= 0) {
        fused.outputs.push_back(dbias);
        g.values[static_cast<size_t>(dbias)].output_index = 1;
        drop[sum_node] = true;
      }
      // Note [The fused GELU gradient runs where its product did]: the product reads the weight; run at the GELU
      // gradient's place, it would read it after anything traced in between, such as the weight's own update in
      // the backward (train.optimizer_in_backward), which then could not overwrite the weight in place and kept an
      // updated copy to the step's end. So the fused node takes the product's place whenever the pre-activation
      // exists there (a block checkpointed in the backward remakes it later), and the reshape between goes.
      const size_t pi = static_cast<size_t>(p - g.nodes.data());
      const int32_t pre_at = g.values[static_cast<size_t>(pre)].producer;
      if (pre_at < static_cast<int32_t>(pi) && !replace.count(pi) && !drop[pi]) {
        replace[pi] = std::move(fused);
        drop[i] = true;
        if (reshape) drop[static_cast<size_t>(reshape - g.nodes.data())] = true;
      } else {
        replace[i] = std::move(fused);
      }
    }
  }

  // Note [cuBLASLt GELU forward epilogue]: gelu_tanh([reshape](linear(x, w, b))) is one linear_gelu node (the
  // GELU_AUX_BIAS epilogue writes the pre-activation for the backward and its GELU from one product). It
  // replaces the linear, which runs first; the GELU's readers all come after the GELU, so after the linear too.
  void forward_gelus() {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& gelu = g.nodes[i];
      const UnaryAttrs* act = match<UnaryAttrs>(*gelu.prim);
      if (!act || act->op != kernels::UnaryOp::GeluTanh || gelu.outputs.size() != 1 || replace.count(i)) continue;
      int32_t pre = gelu.inputs[0];
      const Node* p = producer(pre);
      if (p && match<ReshapeAttrs>(*p->prim)) {
        pre = p->inputs[0];
        p = producer(pre);
      }
      if (!p || !is_linear(*p->prim) || p->inputs.size() != 3 || p->inputs[2] < 0) continue;
      if (!fusable(g.values[static_cast<size_t>(pre)])) continue;
      const size_t li = static_cast<size_t>(p - g.nodes.data());
      if (replace.count(li)) continue;
      Node fused = *p;
      fused.prim = make_linear_gelu(shape(gelu.outputs[0]));
      fused.outputs = {gelu.outputs[0], pre};
      g.values[static_cast<size_t>(gelu.outputs[0])].output_index = 0;
      g.values[static_cast<size_t>(pre)].output_index = 1;
      replace[li] = std::move(fused);
      drop[i] = true;
    }
  }

  // cast(matmul(a, b), f32) of bf16 / f16 operands, the product read nowhere else (a weight gradient on its way
  // to the optimizer's f32 state): one widened product that writes f32, with no rounding to bf16 in between and
  // no separate pass over the gradient (GPT-2 124M: 84 cast kernels, ~0.45 ms per step on an H100). The same for
  // the bias gradient next to it: an eager column sum writes f32 (Note [Column sums]).
  void widened_products() {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& cast = g.nodes[i];
      const CastAttrs* to = match<CastAttrs>(*cast.prim);
      if (!to || to->to != DType::f32 || drop[i]) continue;
      const int32_t prod = cast.inputs[0];
      const Node* p = producer(prod);
      if (!p || uses[static_cast<size_t>(prod)] != 1) continue;
      const size_t pi = static_cast<size_t>(p - g.nodes.data());
      // A bias-gradient sum taken over by a matmul_dgelu above is gone: its cast stays and reads the fused node.
      if (replace.count(pi) || drop[pi]) continue;
      const Value& pv = g.values[static_cast<size_t>(prod)];
      std::shared_ptr<Primitive> wide;
      if (eager_column_sum(g, *p)) {
        wide = widened_sum(*p->prim);
      } else if (const std::optional<MatmulFlags> mf = matmul_flags(*p->prim);
                 mf && (o.cpu_too || pv.device.is_cuda()) && (pv.dtype == DType::bf16 || pv.dtype == DType::f16) &&
                 p->prim->differentiable()) {
        wide = make_matmul_widened(mf->trans_a, mf->trans_b);
      }
      if (!wide) continue;
      Node widened = *p;
      widened.prim = std::move(wide);
      widened.outputs = {cast.outputs[0]};
      g.values[static_cast<size_t>(cast.outputs[0])].output_index = 0;
      replace[pi] = std::move(widened);
      drop[i] = true;
    }
  }
};

}  // namespace

bool fuse_matmul_epilogues(Graph& g, const MatmulEpilogueOptions& o) {
  // Every rewrite here is for values on CUDA (cuBLASLt's epilogues, the eager column sums), unless cpu_too.
  if (!o.target.is_cuda() && !o.cpu_too) return false;
  Epilogues e(g, o);
  e.backward_gelus();
  if (o.forward_gelu) e.forward_gelus();
  e.widened_products();
  if (e.replace.empty()) return false;
  g.rewrite_nodes(std::move(e.replace), e.drop);
  return true;
}

}  // namespace ingot::compiler::passes
