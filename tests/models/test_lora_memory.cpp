// What a LoRA step keeps for its backward (issue 24), counted with the CPU allocator's numbers: a linear over a
// frozen weight saves no input (its weight gradient never runs), a LoRA projection keeps its input (for lora_A's
// gradient) and two rank-r activations but not its [.., out] update, and a Llama with adapters on q/k/v/o keeps
// neither the MLP's inputs nor the second norm's output. Gradients stay what they were: finite differences in f64.
#include <gtest/gtest.h>

#include "../nn/param_gradcheck.h"
#include "../testing.h"
#include "autograd/nn/lora.h"
#include "runtime/allocator.h"
#include "tiny_models.h"

namespace ingot {
namespace {

int64_t allocated() { return cpu_allocator().stats().allocated_bytes; }

// Bytes the CPU allocator holds for n elements of `dtype` (blocks are multiples of 64 bytes).
int64_t block(int64_t n, DType dtype) { return (n * static_cast<int64_t>(itemsize(dtype)) + 63) / 64 * 64; }

// Bytes a forward leaves allocated beyond its result: what its graph saved for the backward.
template <class Fn>
int64_t saved_by(Fn forward) {
  const int64_t before = allocated();
  Tensor y = forward();
  const int64_t saved = allocated() - before - block(y.numel(), y.dtype());
  y.backward(ones(y.shape(), y.dtype()));
  return saved;
}

TEST(LoraMemory, ALinearOverAFrozenWeightSavesNoInputButATrainedOneDoes) {
  manual_seed(3);
  Tensor x = randn({256, 64}).set_requires_grad(true);
  const Tensor frozen = randn({96, 64});
  const Tensor trained = randn({96, 64}).set_requires_grad(true);
  // h = 2x is made inside the forward and dropped there: only the graph can keep it.
  const int64_t h_bytes = block(256 * 64, DType::f32);
  EXPECT_EQ(saved_by([&] { return linear(mul(x, 2.0), frozen); }), 0);
  EXPECT_EQ(saved_by([&] { return matmul(mul(x, 2.0), transpose(frozen, 0, 1)); }), 0);
  EXPECT_EQ(saved_by([&] { return linear(mul(x, 2.0), trained); }), h_bytes);
  EXPECT_EQ(saved_by([&] { return matmul(mul(x, 2.0), transpose(trained, 0, 1)); }), h_bytes);

  // dx = 2 dy W whichever operands were saved.
  x.zero_grad();
  Tensor dy = randn({256, 96});
  linear(mul(x, 2.0), frozen).backward(dy);
  const Tensor want = mul(matmul(dy, frozen), 2.0);
  EXPECT_TRUE(allclose(x.grad(), want, 1e-5, 1e-5));
  x.zero_grad();
  matmul(mul(x, 2.0), transpose(frozen, 0, 1)).backward(dy);
  EXPECT_TRUE(allclose(x.grad(), want, 1e-5, 1e-5));
}

TEST(LoraMemory, ALoraProjectionKeepsItsInputAndTwoRankRActivationsOnly) {
  manual_seed(4);
  const int64_t rows = 256, in = 64, out = 128, r = 4;
  nn::LoRALinear lin(in, out, false);
  lin.add_lora({.rank = r, .alpha = 8.0, .dropout = 0.0, .target_modules = {"x"}});
  const Tensor x = randn({rows, in});
  // The input (lora_A's weight gradient reads it), A x and its scaled copy (lora_B's); not the [rows, out] update.
  const int64_t want = block(rows * in, DType::f32) + 2 * block(rows * r, DType::f32);
  EXPECT_EQ(saved_by([&] { return lin.forward(mul(x, 1.0)); }), want);
}

// Two Llamas with the same weights: every weight trained, and LoRA on q/k/v/o. The LoRA forward saves less by at
// least the frozen MLP's inputs (the second norm's output and the SwiGLU product) of every layer, less the
// adapters' rank-r activations.
TEST(LoraMemory, ALoraLlamaSavesNoInputOfItsFrozenProjections) {
  models::LlamaConfig cfg = testing::tiny_llama_config();
  cfg.hidden_size = 64;
  cfg.intermediate_size = 256;
  cfg.max_position_embeddings = 32;
  const int64_t batch = 2, seq = 32, r = 4, tokens = batch * seq;
  auto [ids, tgt] = testing::repeating_batch(batch, seq);
  manual_seed(5);
  models::Llama full(cfg);
  manual_seed(5);
  models::Llama lora(cfg);
  nn::apply_lora(lora, {.rank = r, .alpha = 8.0, .dropout = 0.0, .target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"}});
  const int64_t full_saved = saved_by([&] { return full.loss(ids, tgt); });
  const int64_t lora_saved = saved_by([&] { return lora.loss(ids, tgt); });
  const int64_t mlp_inputs = cfg.num_hidden_layers * block(tokens * (cfg.hidden_size + cfg.intermediate_size), DType::f32);
  const int64_t adapters = cfg.num_hidden_layers * 4 * 2 * block(tokens * r, DType::f32);
  EXPECT_GE(full_saved - lora_saved, mlp_inputs - adapters) << "full " << full_saved << ", LoRA " << lora_saved;
}

TEST(LoraMemory, AdapterGradientsOfALlamaMatchFiniteDifferencesInF64) {
  manual_seed(6);
  models::Llama model(testing::tiny_llama_config());
  model.to(DType::f64);
  nn::apply_lora(model, {.rank = 2, .alpha = 4.0, .dropout = 0.0, .target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"}});
  for (auto& [name, t] : nn::lora_state_dict(model))
    if (name.find("lora_B") != std::string::npos) {
      Tensor w = t;
      w.copy_(randn(t.shape(), t.dtype(), t.device(), 0.0, 0.3));
    }
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  testing::expect_param_grads(model, [&] { return model.loss(ids, tgt); },
                              {"model.layers.0.self_attn.q_proj.lora_A.weight",
                               "model.layers.0.self_attn.v_proj.lora_B.weight",
                               "model.layers.1.self_attn.k_proj.lora_A.weight",
                               "model.layers.1.self_attn.o_proj.lora_B.weight"});
}

}  // namespace
}  // namespace ingot
