// A tiny LoRA Llama's training step (q, k, v and o adapted, q/k/v sharing their A-product: Note [Adapters of one
// input]) through the two passes of the 8B LoRA profile: Note [Products accumulated in place] takes v_proj's
// forward sum and o_proj's input-gradient sum into their products, Note [Scales folded into products] takes every
// LoRA scale into the products reading the scaled activations, and the compiled step (generated CPU kernels for the
// rest) still gives eager's loss and adapter gradients. The passes are for CUDA targets; cpu_too runs them here, in
// the pipeline's order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "autograd/nn/lora.h"
#include "autograd/ops/attrs.h"
#include "autograd/ops/matmul_fused.h"
#include "compile/graph_checks.h"
#include "compile/passes/passes.h"
#include "compile/step_fixture.h"
#include "compile/trace/trace.h"

namespace ingot::compiler {
namespace {

constexpr double kLoraScale = 5.0 / 2.0;  // alpha 5, rank 2
constexpr int kLayers = 2;

// {ids, targets} -> {loss, each adapter's gradient}: a tiny Llama in `dt` (bf16: f32 weights computing in bf16) whose
// attention projections carry adapters with nonzero B (B starts at zero, as in PEFT; random values make every
// adapter's products and gradients matter). Same weights for every dtype.
auto lora_step(DType dt) {
  manual_seed(21);
  auto model = testing::tiny_llama();
  if (dt == DType::f64) model->to(DType::f64);
  nn::apply_lora(*model,
                 {.rank = 2, .alpha = 5.0, .dropout = 0.0, .target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"}});
  for (auto& [name, t] : nn::lora_state_dict(*model))
    if (name.find("lora_B") != std::string::npos) {
      Tensor w = t;
      w.copy_(randn(t.shape(), t.dtype(), t.device(), 0.0, 0.3));
    }
  if (dt == DType::bf16) model->set_compute_dtype(DType::bf16);
  const std::vector<Tensor> trained = nn::trainable_parameters(*model);
  return [model, trained](const std::vector<Tensor>& a) {
    Tensor loss = model->loss(a[0], a[1]);
    loss.backward();
    std::vector<Tensor> r{loss};
    for (Tensor p : trained) {
      r.push_back(p.grad());
      p.zero_grad();
    }
    return r;
  };
}

int scale_muls(const Graph& g) {
  int n = 0;
  for (const Node& node : g.nodes)
    if (const UnaryAttrs* u = match<UnaryAttrs>(*node.prim))
      n += u->op == kernels::UnaryOp::MulScalar && u->alpha == kLoraScale;
  return n;
}

int scaled_products(const Graph& g) {
  int n = 0;
  for (const Node& node : g.nodes)
    if (std::optional<double> a = product_alpha(*node.prim)) n += *a == kLoraScale;
  return n;
}

// The step's graph through the pipeline's passes up to and including the two (compile/pipeline.cpp), the CUDA-only
// ones asked to run on the CPU; checks what the two rewrote.
template <class Fn>
Graph rewritten_step(const Fn& fn, const std::vector<Tensor>& args, DType dt) {
  Graph g = trace(fn, args).graph;
  passes::simplify(g, {});
  passes::cse(g, {});
  passes::dce(g, {});
  passes::fuse_matmul_epilogues(g, {.cpu_too = true, .with_dbias = true});
  // Per layer: the shared q/k/v and o_proj's scaled activations in the forward, their scaled gradients in the backward.
  EXPECT_EQ(scale_muls(g), 4 * kLayers) << dtype_name(dt);
  EXPECT_TRUE(passes::accumulate_products(g, {.cpu_too = true})) << dtype_name(dt);
  EXPECT_TRUE(passes::scale_into_products(g, {.cpu_too = true})) << dtype_name(dt);
  passes::dce(g, {});
  g.verify();
  EXPECT_EQ(count_nodes(g, "matmul_accumulate"), 2 * kLayers) << "v_proj's forward sum, o_proj's input gradient";
  EXPECT_EQ(scale_muls(g), 0) << dtype_name(dt);
  // Per layer, the products reading a scaled value: q/k/v's and o's B-products, their four B-gradients, and the
  // A-gradient and input-gradient products of the shared A and of o's; the first layer's input needs no gradient
  // (the embedding and its norm are frozen), so its shared input-gradient product is not there.
  EXPECT_EQ(scaled_products(g), 12 * kLayers - 1) << dtype_name(dt);
  return g;
}

TEST(LoraProducts, ALoraStepAccumulatesAndScalesItsProductsAndMatchesEager) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  for (DType dt : {DType::f32, DType::f64}) {
    auto fn = lora_step(dt);
    Graph g = rewritten_step(fn, {ids, tgt}, dt);
    expect_graph_matches_eager(std::move(g), fn, {ids, tgt}, 1e-6, 1e-4, 1e-6, std::string(dtype_name(dt)));
  }
}

// bf16: eager rounds the LoRA-scaled activations, the products before v_proj's sum and the two input-gradient
// products before theirs; the rewritten step rounds each of those once. So it is held to the f64 step rather than
// to eager's bf16 one: each gradient as close as eager's within a factor 1.5 (measured: most much closer, the worst
// at 1.4 of eager's distance), all of them together closer, and the loss as close.
TEST(LoraProducts, ABf16LoraStepIsAsCloseToTheF64StepAsEagerIs) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  const std::vector<Tensor> truth = lora_step(DType::f64)({ids, tgt});
  auto fn = lora_step(DType::bf16);
  const std::vector<Tensor> eager = fn({ids, tgt});
  Graph g = rewritten_step(fn, {ids, tgt}, DType::bf16);
  CompileStats stats;
  std::shared_ptr<Executable> exe = build_executable(std::move(g), {}, stats);
  const std::vector<Tensor> got = execute(*exe, {ids, tgt});
  ASSERT_EQ(got.size(), truth.size());
  EXPECT_LE(std::abs(got[0].item() - truth[0].item()), 1.5 * std::abs(eager[0].item() - truth[0].item()) + 1e-5);
  double got_total = 0, eager_total = 0;
  for (size_t i = 1; i < got.size(); ++i) {
    const double e = max_rel_error(cast(eager[i], DType::f64), truth[i], 1e-2, 1e-3);
    const double c = max_rel_error(cast(got[i], DType::f64), truth[i], 1e-2, 1e-3);
    EXPECT_LE(c, std::max(1.5 * e, 1.0)) << "adapter gradient " << i - 1 << " (eager's distance " << e << ")";
    got_total += c;
    eager_total += e;
  }
  std::printf("[ compare  ] adapter gradients from the f64 step's, summed in tolerances: eager %.3g, rewritten %.3g\n",
              eager_total, got_total);
  EXPECT_LT(got_total, eager_total);
}

}  // namespace
}  // namespace ingot::compiler
