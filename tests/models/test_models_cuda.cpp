// The model families on CUDA against the CPU path: forward, loss, backward and optimizer steps.
#include "optim/clip.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "testing.h"
#include "tiny_models.h"

namespace ingot {
namespace {

// Trains a CPU and a CUDA copy of the same model for `steps` AdamW steps (with clipping); returns the max
// relative error over parameters afterwards and checks the losses along the way.
template <class Model, class Config>
double cpu_vs_cuda(const Config& cfg, int steps) {
  manual_seed(11);
  Model cpu(cfg), gpu(cfg);
  gpu.load_state_dict(cpu.state_dict());
  gpu.to(Device::cuda());
  Tensor w = gpu.named_parameters()[0].second;
  EXPECT_TRUE(w.device().is_cuda() && w.requires_grad() && w.is_leaf());
  auto [ids, tgt] = testing::repeating_batch(2, 12);
  Tensor gids = ids.to(Device::cuda()), gtgt = tgt.to(Device::cuda());
  EXPECT_LE(max_rel_error(gpu.forward(gids), cpu.forward(ids), 1e-3, 1e-4), 1.0);
  optim::AdamW oc(cpu.parameters(), {.lr = 1e-2}), og(gpu.parameters(), {.lr = 1e-2});
  for (int s = 0; s < steps; ++s) {
    Tensor lc = cpu.loss(ids, tgt), lg = gpu.loss(gids, gtgt);
    EXPECT_NEAR(lg.item(), lc.item(), 1e-3 * std::abs(lc.item()) + 1e-4) << "step " << s;
    oc.zero_grad();
    og.zero_grad();
    lc.backward();
    lg.backward();
    double nc = optim::clip_grad_norm(cpu.parameters(), 1.0), ng = optim::clip_grad_norm(gpu.parameters(), 1.0);
    EXPECT_NEAR(ng, nc, 1e-3 * nc) << "step " << s;
    oc.step();
    og.step();
  }
  double worst = 0;
  auto pc = cpu.named_parameters(), pg = gpu.named_parameters();
  for (size_t i = 0; i < pc.size(); ++i) worst = std::max(worst, max_rel_error(pg[i].second, pc[i].second, 1e-3, 1e-4));
  return worst;
}

TEST(ModelsCuda, Gpt2TrainsLikeTheCpuPath) {
  INGOT_REQUIRE_CUDA();
  EXPECT_LE((cpu_vs_cuda<models::GPT2>(testing::tiny_gpt2_config(), 3)), 1.0);
}

TEST(ModelsCuda, LlamaTrainsLikeTheCpuPath) {
  INGOT_REQUIRE_CUDA();
  auto cfg = testing::tiny_llama_config();
  cfg.attention_bias = true;
  EXPECT_LE((cpu_vs_cuda<models::Llama>(cfg, 3)), 1.0);
}

// Qwen3's shape: per-head RMSNorms of q and k before RoPE, heads wider than hidden_size / heads.
TEST(ModelsCuda, Qwen3TrainsLikeTheCpuPath) {
  INGOT_REQUIRE_CUDA();
  auto cfg = testing::tiny_llama_config();
  cfg.model_type = "qwen3";
  cfg.qk_norm = true;
  cfg.head_dim = 2 * cfg.hidden_size / cfg.num_attention_heads;
  EXPECT_LE((cpu_vs_cuda<models::Llama>(cfg, 3)), 1.0);
}

TEST(ModelsCuda, Bf16LlamaWithF32MastersLowersTheLoss) {
  INGOT_REQUIRE_CUDA();
  manual_seed(12);
  models::Llama model(testing::tiny_llama_config());
  model.to(Device::cuda());
  model.to(DType::bf16);
  optim::MasterWeights mw(model.parameters());
  optim::AdamW opt(mw.master(), {.lr = 1e-2, .weight_decay = 0.0});
  auto [ids, tgt] = testing::repeating_batch(2, 12);
  ids = ids.to(Device::cuda());
  tgt = tgt.to(Device::cuda());
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    Tensor loss = model.loss(ids, tgt);
    if (step == 0) first = loss.item();
    last = loss.item();
    model.zero_grad();
    loss.backward();
    mw.copy_grads_to_master();
    opt.step();
    mw.copy_to_model();
  }
  EXPECT_LT(last, 0.1 * first) << "first " << first << " last " << last;
}

TEST(ModelsCuda, Bf16ComputeDtypeKeepsF32ParametersAndGradients) {
  INGOT_REQUIRE_CUDA();
  manual_seed(13);
  models::GPT2 model(testing::tiny_gpt2_config());
  model.to(Device::cuda());
  auto [ids, tgt] = testing::repeating_batch(2, 8);
  ids = ids.to(Device::cuda());
  tgt = tgt.to(Device::cuda());
  double ref = model.loss(ids, tgt).item();
  model.set_compute_dtype(DType::bf16);
  Tensor loss = model.loss(ids, tgt);
  EXPECT_EQ(loss.dtype(), DType::f32);
  EXPECT_NEAR(loss.item(), ref, 2e-2 * ref);
  loss.backward();
  for (const Tensor& p : model.parameters()) {
    ASSERT_TRUE(p.grad().defined()) << p.name();
    EXPECT_EQ(p.grad().dtype(), DType::f32);
  }
}

}  // namespace
}  // namespace ingot
