// compile/passes/lora_epilogue.cpp on the GPU: the scaled, accumulating product (cuBLASLt's alpha and beta = 1
// over the added value's buffer) against the unfused product, scale and add, and a tiny Llama's LoRA step with
// the pass applied against the eager step.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/nn/lora.h"
#include "autograd/ops/matmul_fused.h"
#include "compile/graph_checks.h"
#include "compile/passes/passes.h"
#include "compile/step_fixture.h"
#include "compile/trace/trace.h"
#include "tests/testing.h"

namespace ingot::compiler {
namespace {

const Device kGpu = Device::cuda(0);

double product_rtol(DType dt) { return dt == DType::bf16 ? 2e-2 : 1e-5; }

// alpha * op(a) @ op(b) (+ c) on the GPU, each shape as LoRA makes them: the forward's y + B(h) (a linear,
// b transposed) and the backward's s * (dy @ B) (no transposes); against the unfused ops on the same GPU.
TEST(CudaLoraEpilogue, ScaledProductMatchesTheUnfusedProductScaleAndSum) {
  INGOT_REQUIRE_CUDA();
  struct Case {
    bool ta, tb;
    Shape a, b;
  };
  const Case cases[] = {{false, true, {96, 16}, {80, 16}}, {false, false, {96, 80}, {80, 16}},
                        {true, false, {64, 48}, {64, 80}}};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& k : cases) {
      manual_seed(11);
      const Tensor a = randn(k.a, dt).to(kGpu), b = randn(k.b, dt).to(kGpu);
      const Tensor prod = matmul(k.ta ? transpose(a, 0, 1) : a, k.tb ? transpose(b, 0, 1) : b);
      const Tensor c = randn(prod.shape(), dt).to(kGpu);
      const std::string what = std::string(dtype_name(dt)) + " trans " + std::to_string(k.ta) + std::to_string(k.tb);
      const Tensor want = add(c, mul(prod, 0.25));
      const Tensor got = apply1(make_matmul_scaled(k.ta, k.tb, 0.25, true, prod.shape()), {a, b, c});
      EXPECT_LE(max_rel_error(got.to(Device::cpu()), want.to(Device::cpu()), product_rtol(dt), 1e-5), 1.0) << what;
      // Over c's own buffer (what the executor does when nothing reads c later): beta = 1 reads each element
      // before the product overwrites it.
      const Tensor inplace = c.clone_raw();
      make_matmul_scaled(k.ta, k.tb, 0.25, true, prod.shape())->eval_into({a, b, inplace}, inplace);
      EXPECT_LE(max_rel_error(inplace.to(Device::cpu()), want.to(Device::cpu()), product_rtol(dt), 1e-5), 1.0)
          << what << " in place";
      const Tensor scaled = apply1(make_matmul_scaled(k.ta, k.tb, 0.25, false, prod.shape()), {a, b});
      EXPECT_LE(max_rel_error(scaled.to(Device::cpu()), mul(prod, 0.25).to(Device::cpu()), product_rtol(dt), 1e-5),
                1.0)
          << what << " scaled";
    }
  }
}

// A tiny Llama with rank-4 adapters on q/k/v/o (B not zero, so the adapters matter) on the GPU, traced for one
// step; after the pass its adapters' sums and scales are matmul_scaled nodes, and the compiled graph (generated
// CUDA kernels, cuBLASLt products) matches the eager GPU step.
TEST(CudaLoraEpilogue, LoraStepWithFusedAdaptersMatchesEagerOnTheGpu) {
  INGOT_REQUIRE_CUDA();
  auto [ids_cpu, tgt_cpu] = testing::repeating_batch(2, 8);
  const Tensor ids = ids_cpu.to(kGpu), tgt = tgt_cpu.to(kGpu);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    manual_seed(23);
    auto model = testing::tiny_llama();
    model->to(kGpu);
    if (bf16) model->set_compute_dtype(DType::bf16);
    nn::apply_lora(*model, {.rank = 4, .alpha = 8, .dropout = 0.0,
                            .target_modules = std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}});
    for (auto& [name, t] : nn::lora_state_dict(*model))
      if (name.find("lora_B") != std::string::npos) t.copy_(randn(t.shape(), t.dtype(), t.device(), 0.0, 0.05));
    auto fn = [model](const std::vector<Tensor>& a) {
      Tensor loss = model->loss(a[0], a[1]);
      loss.backward();
      std::vector<Tensor> r{loss};
      for (Tensor p : nn::trainable_parameters(*model)) {
        r.push_back(p.grad());
        p.zero_grad();
      }
      return r;
    };
    Graph g = trace(fn, {ids, tgt}).graph;
    passes::dce(g, {kGpu});
    ASSERT_TRUE(passes::lora_epilogue(g, {kGpu}));
    passes::dce(g, {kGpu});
    EXPECT_GE(count_nodes(g, "matmul_scaled"), 8 * static_cast<int>(testing::tiny_llama_config().num_hidden_layers));
    // bf16: the product is rounded once instead of after the product, the scale and the add (loss within 1e-3).
    expect_graph_matches_eager(std::move(g), fn, {ids, tgt}, bf16 ? 1e-3 : 1e-5, bf16 ? 2e-2 : 1e-4,
                               bf16 ? 2e-3 : 1e-6, bf16 ? "bf16" : "f32");
  }
}

}  // namespace
}  // namespace ingot::compiler
