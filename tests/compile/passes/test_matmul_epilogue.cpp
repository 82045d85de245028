// Note [cuBLASLt GELU backward epilogue] (compile/passes/matmul_epilogue.cpp): in a GPT-2 step every GELU
// becomes one linear_gelu node and every GELU gradient one matmul_dgelu node per block (with the first MLP linear's bias gradient when asked), and
// the step still matches eager. On the CPU the pass runs only when asked (cpu_too); the kernel's CPU version runs here,
// the CUDA one in tests/gpu/test_cuda_matmul_optim.cpp and every compiled GPT-2 step on the GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "compile/exec/executor.h"
#include "compile/graph_checks.h"
#include "compile/passes/passes.h"
#include "compile/pipeline.h"
#include "compile/step_fixture.h"
#include "compile/trace/trace.h"
#include "optim/optimizer.h"

namespace ingot::compiler {
namespace {

TEST(MatmulEpilogue, GeluGradientAndBiasGradientFoldIntoTheProduct) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  for (bool bf16 : {false, true}) {
    manual_seed(13);
    auto model = testing::tiny_gpt2();
    if (bf16) model->set_compute_dtype(DType::bf16);
    auto fn = testing::loss_and_grads(model);
    Graph g = trace(fn, {ids, tgt}).graph;
    const int layers = 2;
    ASSERT_EQ(count_nodes(g, "gelu_tanh_grad"), layers);
    EXPECT_FALSE(passes::fuse_matmul_epilogues(g, {})) << "CPU graphs keep their generated GELU kernels by default";
    // The product and the GELU gradient on one copy; with the bias gradient too (the pipeline's choice on CUDA
    // graphs) on another.
    Graph g2 = trace(fn, {ids, tgt}).graph;
    const int sums_before = count_nodes(g2, "sum");
    ASSERT_TRUE(passes::fuse_matmul_epilogues(g, {.cpu_too = true}));
    ASSERT_TRUE(passes::fuse_matmul_epilogues(g2, {.cpu_too = true, .with_dbias = true}));
    for (Graph* x : {&g, &g2}) {
      passes::dce(*x, {});
      x->verify();
      EXPECT_EQ(count_nodes(*x, "gelu_tanh_grad"), 0);
      EXPECT_EQ(count_nodes(*x, "matmul_dgelu"), layers);
      EXPECT_EQ(count_nodes(*x, "gelu_tanh"), 0) << "the forward GELU joins its linear";
      EXPECT_EQ(count_nodes(*x, "linear_gelu"), layers);
      int widened = 0;
      for (const Node& n : x->nodes) widened += n.prim->name() == "matmul" && exact_attrs(*n.prim).find("out=f32") != std::string::npos;
      // bf16: each block's four weight gradients and the tied head's are f32 products; f32 graphs have no casts.
      EXPECT_EQ(widened, bf16 ? 4 * layers + 1 : 0);
    }
    for (const Node& n : g.nodes) {
      if (n.prim->name() != "matmul_dgelu") continue;
      EXPECT_EQ(n.outputs.size(), 1u);
    }
    for (const Node& n : g2.nodes) {
      if (n.prim->name() != "matmul_dgelu") continue;
      EXPECT_EQ(n.outputs.size(), 2u) << "the bias gradient comes along";
    }
    EXPECT_EQ(count_nodes(g, "sum"), sums_before);
    EXPECT_EQ(count_nodes(g2, "sum"), sums_before - layers);
    for (Graph* x : {&g, &g2}) {
      CompileStats stats;
      std::shared_ptr<Executable> exe = build_executable(std::move(*x), {}, stats);
      const std::vector<Tensor> got = execute(*exe, {ids, tgt}), want = fn({ids, tgt});
      ASSERT_EQ(got.size(), want.size());
      // bf16: the fused product rounds once where eager rounds the product and then the GELU gradient.
      const double rtol = bf16 ? 2e-2 : 1e-4, atol = bf16 ? 2e-3 : 1e-5;
      EXPECT_NEAR(got[0].item(), want[0].item(), 1e-5 * std::abs(want[0].item()));
      for (size_t i = 1; i < want.size(); ++i)
        EXPECT_LE(max_rel_error(got[i], want[i], rtol, atol), 1.0) << (bf16 ? "bf16" : "f32") << " parameter " << i - 1;
    }
  }
}

// Note [The fused GELU gradient runs where its product did]: with every parameter updated in the backward (a hook
// per parameter, as train.optimizer_in_backward sets), the MLP's second weight is updated between its input-gradient
// product and the GELU gradient. The fused node reads that weight, so it must run where the product did, before the
// update: then every update may overwrite its parameter in place (at the GELU gradient's place, the c_proj weights'
// updates wrote copies kept to the step's end: 4 of them in a tiny GPT-2 on an H200, 3.7 MB of a 17 MB step).
TEST(MatmulEpilogue, TheFusedGeluGradientRunsBeforeItsWeightsUpdateInTheBackward) {
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  manual_seed(13);
  auto model = testing::tiny_gpt2();
  std::vector<Tensor> params = model->parameters();
  optim::AdamW opt(params, optim::AdamWOptions{.lr = 1e-3});
  for (Tensor& p : params)
    p.register_post_accumulate_grad_hook([&opt](Tensor&) {
      opt.step();
      opt.zero_grad();
    });
  auto fn = [&](const std::vector<Tensor>& a) {
    Tensor loss = model->loss(a[0], a[1]);
    loss.backward();
    return std::vector<Tensor>{loss.detach()};
  };
  Graph g = trace(fn, {ids, tgt}).graph;
  ASSERT_TRUE(passes::fuse_matmul_epilogues(g, {.cpu_too = true}));
  passes::dce(g, {});
  g.verify();
  ASSERT_EQ(count_nodes(g, "matmul_dgelu"), 2);
  int updates = 0;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& u = g.nodes[n];
    if (u.prim->name() != "adamw_update") continue;
    ++updates;
    // inputs: hyper, parameter, gradient, moments; outputs: the parameter, moments.
    EXPECT_TRUE(in_place_ok(g, static_cast<int32_t>(n), u.inputs[1], u.outputs[0]))
        << "the update of " << g.inputs[static_cast<size_t>(g.values[static_cast<size_t>(u.inputs[1])].input_index)].name
        << " (node " << n << ") cannot overwrite it";
  }
  EXPECT_EQ(updates, static_cast<int>(params.size())) << "one update per parameter, each in the backward";
}

}  // namespace
}  // namespace ingot::compiler
