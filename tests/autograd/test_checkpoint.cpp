// Activation checkpointing (autograd/checkpoint.h, DecoderBlock::set_checkpointing): a checkpointed region keeps
// only its inputs for the backward and recomputes the rest there, eagerly and, traced, in the compiled step
// (Note [Recomputed nodes]); gradients stay those of the plain forward.
#include <gtest/gtest.h>

#include <cstdio>

#include "../models/tiny_models.h"
#include "../testing.h"
#include "autograd/checkpoint.h"
#include "autograd/nn/lora.h"
#include "compile/api.h"
#include "models/decoder.h"
#include "optim/optimizer.h"
#include "runtime/allocator.h"
#include "runtime/rng.h"

namespace ingot {
namespace {

int64_t allocated() { return cpu_allocator().stats().allocated_bytes; }
bool bitwise_equal(const Tensor& a, const Tensor& b) { return a.shape() == b.shape() && a.to_vector() == b.to_vector(); }

// y = sum(tanh(x W^T) * x W^T): three ops saving [rows, out] values each, plus the weight.
std::vector<Tensor> region_fn(const std::vector<Tensor>& in, const Tensor& w) {
  Tensor h = linear(in[0], w);
  return {mul(tanh(h), h)};
}

TEST(ActivationCheckpoint, ARegionKeepsOnlyItsInputAndGivesTheSameGradients) {
  manual_seed(1);
  Tensor x = randn({512, 64}).set_requires_grad(true);
  Tensor w = randn({128, 64}, DType::f32, Device::cpu(), 0.0, 0.1).set_requires_grad(true);
  auto run = [&](bool ckpt) {
    x.zero_grad();
    w.zero_grad();
    const int64_t before = allocated();
    Tensor y = ckpt ? checkpoint([w](const std::vector<Tensor>& in) { return region_fn(in, w); }, {x})[0]
                    : region_fn({x}, w)[0];
    const int64_t kept = allocated() - before - 512 * 128 * 4;  // beyond y itself
    y.backward(ones(y.shape()));
    return std::tuple{kept, clone(x.grad()), clone(w.grad())};
  };
  const auto [plain_kept, plain_dx, plain_dw] = run(false);
  const auto [ckpt_kept, ckpt_dx, ckpt_dw] = run(true);
  EXPECT_GE(plain_kept, 2 * 512 * 128 * 4);  // h and tanh(h) at least
  EXPECT_EQ(ckpt_kept, 0) << "x and w are the caller's; nothing else is kept";
  // The same ops on the same values: bit-equal.
  EXPECT_TRUE(bitwise_equal(ckpt_dx, plain_dx));
  EXPECT_TRUE(bitwise_equal(ckpt_dw, plain_dw));
}

TEST(ActivationCheckpoint, DropoutInARegionDrawsTheSameMaskWhenRecomputed) {
  manual_seed(2);
  Tensor x = randn({64, 32}).set_requires_grad(true);
  auto fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{mul(dropout(mul(in[0], in[0]), 0.5), 3.0)}; };
  manual_seed(7);
  fn({x})[0].backward(ones({64, 32}));
  const Tensor want = clone(x.grad());
  const uint64_t offset = default_generator(Device::cpu()).offset();
  x.zero_grad();
  manual_seed(7);
  checkpoint(fn, {x})[0].backward(ones({64, 32}));
  EXPECT_TRUE(bitwise_equal(x.grad(), want));
  EXPECT_EQ(default_generator(Device::cpu()).offset(), offset) << "the recomputation drew nothing new";
}

TEST(ActivationCheckpoint, AnInputChangedInPlaceOrAFunctionThatChangesAreErrors) {
  Tensor x = randn({8, 8}).set_requires_grad(true);
  Tensor a = mul(x, 2.0);
  Tensor y = checkpoint([](const std::vector<Tensor>& in) { return std::vector<Tensor>{tanh(in[0])}; }, {a})[0];
  a.copy_(ones({8, 8}));
  EXPECT_NE(testing::error_of([&] { y.backward(ones({8, 8})); }).find("modified in place after its forward"),
            std::string::npos);
  int calls = 0;
  Tensor z = checkpoint(
      [&calls](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{++calls == 1 ? tanh(tanh(in[0])) : tanh(in[0])};
      },
      {x})[0];
  EXPECT_NE(testing::error_of([&] { z.backward(ones({8, 8})); }).find("must run the same ops each time"),
            std::string::npos);
}

// Traced, the recomputation reads the forward's (seed, offset) host input: a compiled step with a checkpointed
// dropout draws each mask once per call and gives the plain eager step's losses and gradients call after call.
TEST(ActivationCheckpoint, ACompiledRegionWithDropoutDrawsEachMaskOnce) {
  manual_seed(3);
  Tensor w = randn({32, 16}, DType::f32, Device::cpu(), 0.0, 0.2).set_requires_grad(true);
  const Tensor x = randn({64, 16});
  auto region = [w](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{dropout(tanh(linear(in[0], w)), 0.3)};
  };
  auto step = [&](bool ckpt) {
    return [&, ckpt](const std::vector<Tensor>& a) {
      Tensor y = ckpt ? checkpoint(region, {a[0]})[0] : region({a[0]})[0];
      Tensor loss = sum(mul(y, y));
      loss.backward();
      Tensor g = clone(w.grad());
      w.zero_grad();
      return std::vector<Tensor>{loss, g};
    };
  };
  manual_seed(9);
  std::vector<std::vector<Tensor>> want;
  for (int i = 0; i < 3; ++i) want.push_back(step(false)({x}));
  const uint64_t offset = default_generator(Device::cpu()).offset();
  manual_seed(9);
  CompiledFunction compiled = compile(step(true));
  for (int i = 0; i < 3; ++i) {
    const std::vector<Tensor> got = compiled({x});
    EXPECT_NEAR(got[0].item(), want[static_cast<size_t>(i)][0].item(), 1e-5 * want[static_cast<size_t>(i)][0].item())
        << "call " << i + 1;
    // Generated f32 kernels (tanh, the sum's order) against eager ones: the plain compiled step differs as much.
    EXPECT_LE(max_rel_error(got[1], want[static_cast<size_t>(i)][1], 1e-4, 1e-6), 1.0) << "call " << i + 1;
  }
  EXPECT_EQ(compiled.stats().compiled_calls, 2);
  EXPECT_EQ(default_generator(Device::cpu()).offset(), offset) << "one draw per dropout per call";
}

// A small Llama with LoRA on q/k/v/o, as lora_finetune trains it: 4 layers, sequence 256.
models::LlamaConfig llama_config() {
  models::LlamaConfig c = testing::tiny_llama_config();
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.intermediate_size = 176;
  c.num_hidden_layers = 4;
  c.max_position_embeddings = 256;
  return c;
}

std::unique_ptr<models::Llama> lora_llama(bool ckpt) {
  manual_seed(11);
  auto m = std::make_unique<models::Llama>(llama_config());
  nn::apply_lora(*m, {.rank = 4, .alpha = 8.0, .dropout = 0.0, .target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"}});
  for (auto& [name, t] : nn::lora_state_dict(*m))
    if (name.find("lora_B") != std::string::npos) {
      Tensor w = t;
      w.copy_(randn(t.shape(), t.dtype(), t.device(), 0.0, 0.1));
    }
  EXPECT_EQ(models::set_checkpointing(*m, ckpt ? models::Checkpointing::blocks : models::Checkpointing::none), ckpt ? 4 : 0);
  return m;
}

std::vector<Tensor> trained(nn::Module& m) {
  std::vector<Tensor> ps;
  for (const Tensor& p : m.parameters())
    if (p.requires_grad()) ps.push_back(p);
  return ps;
}

TEST(ActivationCheckpoint, LlamaBlocksGiveEagersGradientsAndKeepLessForTheBackward) {
  auto [ids, tgt] = testing::repeating_batch(2, 256, 7);
  struct Run {
    double loss = 0;
    int64_t kept = 0, peak = 0;
    std::vector<Tensor> grads;
  };
  auto run = [&](bool ckpt) {
    auto m = lora_llama(ckpt);
    Run r;
    const int64_t before = allocated();
    cpu_allocator().reset_peak();
    Tensor loss = m->loss(ids, tgt);
    r.kept = allocated() - before;
    loss.backward();
    r.peak = cpu_allocator().stats().peak_allocated_bytes - before;
    r.loss = loss.item();
    for (const Tensor& p : trained(*m)) r.grads.push_back(clone(p.grad()));
    return r;
  };
  const Run plain = run(false), ckpt = run(true);
  std::printf("[ memory   ] 4-layer LoRA Llama, 2 x 256: kept after the forward %lld -> %lld bytes, step peak %lld -> "
              "%lld bytes\n",
              static_cast<long long>(plain.kept), static_cast<long long>(ckpt.kept),
              static_cast<long long>(plain.peak), static_cast<long long>(ckpt.peak));
  EXPECT_EQ(ckpt.loss, plain.loss);
  ASSERT_EQ(ckpt.grads.size(), plain.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_TRUE(bitwise_equal(ckpt.grads[i], plain.grads[i])) << i;
  // Each block keeps its [2, 256, 64] f32 input; the rest (norms, q/k/v, attention, the SwiGLU: over 10 such
  // values a layer) is recomputed one block at a time.
  const int64_t block_input = 2 * 256 * 64 * 4;
  EXPECT_LE(ckpt.kept, plain.kept - 4 * 4 * block_input) << plain.kept << " vs " << ckpt.kept;
  EXPECT_LT(ckpt.peak, plain.peak);
}

// Note [MLP checkpointing] (models/decoder.cpp): only each MLP's norm, up-projections and SwiGLU are a region. The
// loss and gradients are eager's bit for bit, and each layer keeps the region's input ([2, 256, 64] f32, the residual
// stream, which the norm's backward read anyway) instead of the SwiGLU's two [2, 256, 176] operands. With train.activation_checkpointing_layers = 3, the fourth block keeps them again.
TEST(ActivationCheckpoint, LlamaMlpRegionsGiveEagersGradientsAndKeepTheMlpInputOnly) {
  auto [ids, tgt] = testing::repeating_batch(2, 256, 7);
  struct Run {
    double loss = 0;
    int64_t kept = 0;
    std::vector<Tensor> grads;
  };
  auto run = [&](int64_t layers) {
    auto m = lora_llama(false);
    EXPECT_EQ(models::set_checkpointing(*m, layers < 0 ? models::Checkpointing::none : models::Checkpointing::mlp,
                                        std::max<int64_t>(layers, 0)),
              layers < 0 ? 0 : layers == 0 ? 4 : layers);
    Run r;
    const int64_t before = allocated();
    Tensor loss = m->loss(ids, tgt);
    r.kept = allocated() - before;
    loss.backward();
    r.loss = loss.item();
    for (const Tensor& p : trained(*m)) r.grads.push_back(clone(p.grad()));
    return r;
  };
  const Run plain = run(-1), mlp = run(0), three = run(3);
  for (const Run* r : {&mlp, &three}) {
    EXPECT_EQ(r->loss, plain.loss);
    ASSERT_EQ(r->grads.size(), plain.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_TRUE(bitwise_equal(r->grads[i], plain.grads[i])) << i;
  }
  // Per block the two operands are no longer kept; the region's input is what the norm's backward kept anyway (a
  // region starting after the norm kept its output too: 4 * [2, 256, 64] f32 more).
  const int64_t operand = 2 * 256 * 176 * 4, per_block = 2 * operand;
  EXPECT_LE(mlp.kept, plain.kept - 4 * per_block) << plain.kept << " vs " << mlp.kept;
  EXPECT_LE(three.kept, plain.kept - 3 * per_block) << plain.kept << " vs " << three.kept;
  EXPECT_GE(three.kept, mlp.kept + per_block) << mlp.kept << " vs " << three.kept;
}

// The compiled step traces the recomputation where the eager backward runs it: its graph keeps the blocks' inputs
// only, so the planned peak drops, with the same losses and adapters as the plain compiled step.
TEST(ActivationCheckpoint, CompiledLlamaBlocksLowerThePlannedPeakWithTheSameTraining) {
  auto [ids, tgt] = testing::repeating_batch(2, 256, 7);
  struct Run {
    std::vector<double> losses;
    std::vector<Tensor> params;
    CompileStats stats;
    int64_t peak = 0;
  };
  auto run = [&](bool ckpt) {
    auto m = lora_llama(ckpt);
    optim::AdamW opt(trained(*m), optim::AdamWOptions{.lr = 1e-2});
    auto fn = [&](const std::vector<Tensor>& b) {
      Tensor loss = m->loss(b[0], b[1]);
      loss.backward();
      opt.step();
      opt.zero_grad();
      return std::vector<Tensor>{loss};
    };
    CompiledFunction step = compile(fn);
    Run r;
    for (int i = 0; i < 3; ++i) {
      if (i == 2) cpu_allocator().reset_peak();
      const int64_t before = allocated();
      r.losses.push_back(step({ids, tgt})[0].item());
      if (i == 2) r.peak = cpu_allocator().stats().peak_allocated_bytes - before;
    }
    for (const Tensor& p : trained(*m)) r.params.push_back(clone(p));
    r.stats = step.stats();
    return r;
  };
  const Run plain = run(false), ckpt = run(true);
  std::printf("[ memory   ] compiled 4-layer LoRA Llama, 2 x 256: planned peak %lld -> %lld bytes, step peak %lld -> "
              "%lld bytes\n",
              static_cast<long long>(plain.stats.planned_peak_bytes), static_cast<long long>(ckpt.stats.planned_peak_bytes),
              static_cast<long long>(plain.peak), static_cast<long long>(ckpt.peak));
  EXPECT_EQ(ckpt.stats.compiles, 1);
  for (size_t i = 0; i < plain.losses.size(); ++i)
    EXPECT_NEAR(ckpt.losses[i], plain.losses[i], 1e-6 * plain.losses[i]) << "step " << i + 1;
  ASSERT_EQ(ckpt.params.size(), plain.params.size());
  for (size_t i = 0; i < plain.params.size(); ++i)
    EXPECT_LE(max_rel_error(ckpt.params[i], plain.params[i], 1e-5, 1e-7), 1.0) << i;
  const int64_t block_input = 2 * 256 * 64 * 4;
  EXPECT_LE(ckpt.stats.planned_peak_bytes, plain.stats.planned_peak_bytes - 4 * 4 * block_input);
  EXPECT_LT(ckpt.peak, plain.peak);
}

}  // namespace
}  // namespace ingot
