// The whole training step compiled for a GPU (generated CUDA kernels through NVRTC, matmuls and attention
// through the eager cuBLASLt/cuDNN kernels) against the eager GPU step and against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "autograd/nn/lora.h"
#include "compile/step_fixture.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "runtime/allocator.h"
#include "runtime/file_util.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

const Device kGpu = Device::cuda(0);

// Each test compiles into its own cache directory: the first compile of a process must really run NVRTC.
CompileOptions fresh_cache(const TempDir& dir) {
  CompileOptions o;
  o.cache_dir = dir.path();
  return o;
}

TEST(CompileCudaStep, TinyGpt2TwentyStepsMatchEagerOnTheGpu) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  StepRun eager = train_steps(tiny_gpt2, false, 20, {}, 2, 8, kGpu);
  StepRun comp = train_steps(tiny_gpt2, true, 20, fresh_cache(dir), 2, 8, kGpu);
  expect_same_training(eager, comp);
  EXPECT_EQ(comp.stats.compiles, 1);
  EXPECT_TRUE(comp.stats.graph_breaks.empty());
  EXPECT_GT(comp.stats.kernels, 0) << "fused groups run as generated CUDA kernels";
  EXPECT_GT(comp.stats.kernels_generated, 0) << "a fresh cache directory compiles with NVRTC";
  std::printf("[ kernels  ] %lld ops (%lld not views) -> %lld launches, %lld generated kernels (%lld compiled)\n",
              static_cast<long long>(comp.stats.ops_before), static_cast<long long>(comp.stats.compute_ops),
              static_cast<long long>(comp.stats.launches), static_cast<long long>(comp.stats.kernels),
              static_cast<long long>(comp.stats.kernels_generated));
}

// Same initial weights (made on the CPU, then moved), same batches: the GPU-compiled run follows the CPU's
// eager run. Looser than eager-vs-compiled on one device: cuBLASLt and the CPU's BLAS sum in different orders.
TEST(CompileCudaStep, TinyGpt2CompiledOnTheGpuMatchesTheCpu) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  StepRun cpu = train_steps(tiny_gpt2, false, 20);
  StepRun gpu = train_steps(tiny_gpt2, true, 20, fresh_cache(dir), 2, 8, kGpu);
  expect_same_training(cpu, gpu, 3e-3, 3e-4);
}

TEST(CompileCudaStep, TinyLlamaTwentyStepsMatchEagerOnTheGpu) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  StepRun eager = train_steps(tiny_llama, false, 20, {}, 2, 8, kGpu);
  StepRun comp = train_steps(tiny_llama, true, 20, fresh_cache(dir), 2, 8, kGpu);
  expect_same_training(eager, comp);
  EXPECT_TRUE(comp.stats.graph_breaks.empty());
  EXPECT_GT(comp.stats.kernels, 0);
}

// bf16 compute (matmuls and attention in bf16, norms/softmax/loss in f32): compiled and eager round the same
// bf16 products, but fused f32 chains differ in their last bits, which bf16 casts can magnify by one ulp
// (2^-8 relative); losses agree to 1e-2 relative over 10 steps.
TEST(CompileCudaStep, Bf16ComputeCompiledMatchesEagerOnTheGpu) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  auto bf16 = [](auto& m) { m->set_compute_dtype(DType::bf16); };
  StepRun eager = train_steps(tiny_gpt2, false, 10, {}, 4, 16, kGpu, bf16);
  StepRun comp = train_steps(tiny_gpt2, true, 10, fresh_cache(dir), 4, 16, kGpu, bf16);
  for (size_t i = 0; i < eager.losses.size(); ++i)
    EXPECT_NEAR(comp.losses[i], eager.losses[i], 1e-2 * std::abs(eager.losses[i])) << "step " << i;
  EXPECT_LT(eager.losses.back(), eager.losses.front() - 0.5);
  EXPECT_GT(comp.stats.kernels, 0);
}

// bf16 compute with f32 parameters at a size where the bias gradients run as eager column sums (>= 2048 rows,
// >= 256 columns, compile/passes/fuse.cpp's eager_column_sum): the GELU-gradient product takes the c_fc bias
// gradient along (matmul_dgelu with dbias) while the f32 widening takes the other bias sums. When the two passes
// disagreed about one sum the step failed graph verification (adamw_update read a value with no producer); the
// tiny models above have too few rows to take that path. On an H100 / H200 the product is the own sm_90a kernel.
TEST(CompileCudaStep, Bf16GptWithColumnSumBiasGradientsMatchesEager) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  auto make = [] {
    models::GPT2Config c = tiny_gpt2_config();
    c.vocab_size = 512;
    c.n_positions = 512;
    c.n_embd = 256;
    return std::make_shared<models::GPT2>(c);
  };
  auto bf16 = [](auto& m) { m->set_compute_dtype(DType::bf16); };
  StepRun eager = train_steps(make, false, 4, {}, 4, 512, kGpu, bf16);
  StepRun comp = train_steps(make, true, 4, fresh_cache(dir), 4, 512, kGpu, bf16);
  for (size_t i = 0; i < eager.losses.size(); ++i)
    EXPECT_NEAR(comp.losses[i], eager.losses[i], 1e-2 * std::abs(eager.losses[i])) << "step " << i;
  EXPECT_LT(eager.losses.back(), eager.losses.front());
  EXPECT_TRUE(comp.stats.graph_breaks.empty());
  auto count = [&](const std::string& what) {
    int n = 0;
    for (size_t at = comp.stats.last_graph.find(what); at != std::string::npos;
         at = comp.stats.last_graph.find(what, at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(count("dbias=1"), 2) << "one matmul_dgelu with the bias gradient per block\n" << comp.stats.last_graph;
  EXPECT_GE(count("keepdim=false, out=f32"), 2) << "widened bias sums\n" << comp.stats.last_graph;
}

// A second compile of the same step in the same cache directory loads every cubin from disk.
TEST(CompileCudaStep, WarmCacheCompilesNothing) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  StepRun cold = train_steps(tiny_gpt2, true, 2, fresh_cache(dir), 2, 8, kGpu);
  StepRun warm = train_steps(tiny_gpt2, true, 2, fresh_cache(dir), 2, 8, kGpu);
  EXPECT_GT(cold.stats.kernels_generated, 0);
  EXPECT_EQ(warm.stats.kernels_generated, 0) << "kernels come from the in-process table or the disk cache";
  EXPECT_EQ(warm.stats.kernels, cold.stats.kernels);
}

// reduce-overhead: after one warm-up call the step is captured into one CUDA graph and replayed; the optimizer
// update is inside it, reading its learning rate (a cosine schedule here: it changes every call) from device
// memory refreshed before each replay (Note [Scalars read from the device]): a frozen learning rate would not
// follow eager.
TEST(CompileCudaStep, ReduceOverheadReplaysCudaGraphsAndMatchesEager) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  CompileOptions o = fresh_cache(dir);
  o.mode = CompileMode::ReduceOverhead;
  StepRun eager = train_steps(tiny_gpt2, false, 20, {}, 2, 8, kGpu);
  StepRun comp = train_steps(tiny_gpt2, true, 20, o, 2, 8, kGpu);
  expect_same_training(eager, comp);
  EXPECT_EQ(comp.stats.cuda_graph_fallback, "");
  EXPECT_EQ(comp.stats.cuda_graphs, 1);
  EXPECT_EQ(comp.stats.cuda_graph_host_steps, 0) << "the AdamW update reads its scalars from the device";
  std::printf("[ graphs   ] %lld CUDA graph(s), %lld step(s) between them, %lld launches without graphs\n",
              static_cast<long long>(comp.stats.cuda_graphs), static_cast<long long>(comp.stats.cuda_graph_host_steps),
              static_cast<long long>(comp.stats.launches));
  StepRun plain = train_steps(tiny_gpt2, true, 3, fresh_cache(dir), 2, 8, kGpu);
  EXPECT_EQ(plain.stats.cuda_graphs, 0) << "default mode launches kernels one by one";
}

TEST(CompileCudaStep, ReduceOverheadBf16LlamaMatchesEager) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  CompileOptions o = fresh_cache(dir);
  o.mode = CompileMode::ReduceOverhead;
  auto bf16 = [](auto& m) { m->set_compute_dtype(DType::bf16); };
  StepRun eager = train_steps(tiny_llama, false, 10, {}, 4, 16, kGpu, bf16);
  StepRun comp = train_steps(tiny_llama, true, 10, o, 4, 16, kGpu, bf16);
  for (size_t i = 0; i < eager.losses.size(); ++i)
    EXPECT_NEAR(comp.losses[i], eager.losses[i], 1e-2 * std::abs(eager.losses[i])) << "step " << i;
  EXPECT_EQ(comp.stats.cuda_graph_fallback, "");
  EXPECT_GE(comp.stats.cuda_graphs, 1);
}

// Rank-4 adapters on q/k/v/o, after a bf16 compute dtype when `bf16`: what the LoRA step tests apply to a model.
auto qkvo_lora(bool bf16) {
  return [bf16](auto& m) {
    if (bf16) m->set_compute_dtype(DType::bf16);
    nn::apply_lora(*m, {.rank = 4, .alpha = 8, .dropout = 0.0,
                        .target_modules = std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}});
  };
}

// LoRA on the GPU (rank 4 on q/k/v/o, B starting at zero as in a fine-tune, AdamW inside the compiled step on
// the adapters alone): the compiled steps follow the eager ones from the first compiled call on, and so does each
// step's loss change, which is what the previous update did to the adapters' output. A compiled step that read
// adapter weights from before the traced step's update (the lora_epilogue pass at the 8B shape, bench/RESULTS.md
// fifteenth session) changed the loss at its first compiled call by an eighth of eager's change, within a bf16
// loss tolerance but not within this one.
TEST(CompileCudaStep, LoraLlamaFollowsEagerFromTheFirstCompiledCall) {
  INGOT_REQUIRE_CUDA();
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    TempDir dir("ingot-compile-cuda-");
    const auto lora = qkvo_lora(bf16);
    const StepRun eager = train_steps(tiny_llama, false, 6, {}, 2, 16, kGpu, lora);
    const StepRun comp = train_steps(tiny_llama, true, 6, fresh_cache(dir), 2, 16, kGpu, lora);
    const double tol = bf16 ? 1e-2 : 1e-4;
    for (size_t i = 0; i < eager.losses.size(); ++i) {
      EXPECT_NEAR(comp.losses[i], eager.losses[i], tol * std::abs(eager.losses[i])) << "step " << i;
      if (i == 0) continue;
      const double de = eager.losses[i] - eager.losses[i - 1], dc = comp.losses[i] - comp.losses[i - 1];
      std::printf("[ lora     ] %s step %zu: loss change eager %.6g, compiled %.6g\n", bf16 ? "bf16" : "f32", i, de, dc);
      // Run on the CPU, the bf16 changes differed by at most 2.5e-4 (6e-5 of the loss of ~4.15, within 1e-5 in f32);
      // an eighth of eager's first change (0.006) would be off by 0.0053, over this bound of ~0.0036.
      EXPECT_NEAR(dc, de, 0.25 * std::abs(de) + (bf16 ? 5e-4 : 1e-5) * std::abs(eager.losses[i])) << "step " << i;
    }
    EXPECT_GT(std::abs(eager.losses[1] - eager.losses[0]), 1e-3 * std::abs(eager.losses[0]))
        << "the first update must move the loss for the change check to mean anything";
    EXPECT_EQ(comp.stats.compiles, 1);
  }
}

// Qwen3's q/k norms between the projections (with their adapters) and RoPE, compiled for the GPU: f32 follows
// eager within 1e-4, bf16 within 1e-2 (as LoraLlamaFollowsEagerFromTheFirstCompiledCall).
TEST(CompileCudaStep, LoraQwen3FollowsEager) {
  INGOT_REQUIRE_CUDA();
  auto qwen3 = [] {
    models::LlamaConfig c = tiny_llama_config();
    c.model_type = "qwen3";
    c.qk_norm = true;
    c.head_dim = 2 * c.hidden_size / c.num_attention_heads;
    return std::make_shared<models::Llama>(c);
  };
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    TempDir dir("ingot-compile-cuda-");
    const auto lora = qkvo_lora(bf16);
    const StepRun eager = train_steps(qwen3, false, 6, {}, 2, 16, kGpu, lora);
    const StepRun comp = train_steps(qwen3, true, 6, fresh_cache(dir), 2, 16, kGpu, lora);
    const double tol = bf16 ? 1e-2 : 1e-4;
    for (size_t i = 0; i < eager.losses.size(); ++i)
      EXPECT_NEAR(comp.losses[i], eager.losses[i], tol * std::abs(eager.losses[i])) << "step " << i;
    EXPECT_GT(std::abs(eager.losses[5] - eager.losses[0]), 1e-3 * std::abs(eager.losses[0])) << "the adapters train";
    EXPECT_EQ(comp.stats.compiles, 1);
    EXPECT_TRUE(comp.stats.graph_breaks.empty());
  }
}

// The LoRA recipe's precision on the GPU: a bf16 model whose bf16 adapters train through f32 master weights, the
// updated masters cast back into the adapters at the step's end (one multi-tensor kernel in compiled steps, Note
// [Update copies], compile/passes/fuse.cpp). Compiled, in default mode and under CUDA graphs, follows eager: the
// losses and the adapters after six steps.
TEST(CompileCudaStep, Bf16AdaptersThroughF32MastersFollowEager) {
  INGOT_REQUIRE_CUDA();
  struct Run {
    std::vector<double> losses;
    std::vector<Tensor> initial, adapters;
  };
  auto run = [](bool compiled, CompileMode mode, const TempDir& dir) {
    manual_seed(7);
    auto model = tiny_llama();
    model->to(DType::bf16);
    model->to(kGpu);
    nn::apply_lora(*model, {.rank = 4, .alpha = 8, .dropout = 0.0,
                            .target_modules = std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}});
    std::vector<Tensor> trained;
    for (const Tensor& p : model->parameters())
      if (p.requires_grad()) trained.push_back(p);
    {  // B starts at zero: give it values so that every copy back changes something from the first step
      NoGradGuard ng;
      for (Tensor& p : trained) p.copy_(randn(p.shape(), DType::f32, kGpu, 0, 0.05).to(DType::bf16));
    }
    Run r;
    for (const Tensor& p : trained) r.initial.push_back(p.to(Device::cpu()).to(DType::f32));
    optim::MasterWeights mw(trained);
    optim::AdamW opt(mw.master(), optim::AdamWOptions{3e-3, 0.9, 0.95, 1e-8, 0.1});
    auto [ids_cpu, tgt_cpu] = repeating_batch(2, 16);
    Tensor ids = ids_cpu.to(kGpu), tgt = tgt_cpu.to(kGpu);
    auto fn = [&](const std::vector<Tensor>& batch) {
      Tensor loss = model->loss(batch[0], batch[1]);
      loss.backward();
      mw.copy_grads_to_master();
      opt.step();
      mw.copy_to_model();
      opt.zero_grad();
      for (Tensor p : trained) p.zero_grad();
      return std::vector<Tensor>{loss};
    };
    CompileOptions o = fresh_cache(dir);
    o.mode = mode;
    CompiledFunction step = compile(fn, o);
    for (int i = 0; i < 6; ++i) r.losses.push_back((compiled ? step({ids, tgt}) : fn({ids, tgt}))[0].item());
    for (const Tensor& p : trained) r.adapters.push_back(p.to(Device::cpu()).to(DType::f32));
    return r;
  };
  TempDir dir("ingot-compile-cuda-");
  const Run eager = run(false, CompileMode::Default, dir);
  for (CompileMode mode : {CompileMode::Default, CompileMode::ReduceOverhead}) {
    SCOPED_TRACE(mode == CompileMode::Default ? "default" : "reduce-overhead");
    TempDir d("ingot-compile-cuda-");
    const Run comp = run(true, mode, d);
    for (size_t i = 0; i < eager.losses.size(); ++i)
      EXPECT_NEAR(comp.losses[i], eager.losses[i], 1e-2 * std::abs(eager.losses[i])) << "step " << i;
    ASSERT_EQ(comp.adapters.size(), eager.adapters.size());
    // Element by element AdamW amplifies last-bit gradient differences (it divides by sqrt(v)): on an H200 two of
    // the sixteen adapters (k_proj's) had elements more than 2e-3 from eager's after six steps. On average each
    // adapter must have moved as eager's did: a copy back that never landed leaves the adapter where it started
    // (a difference as large as eager's whole movement).
    for (size_t i = 0; i < eager.adapters.size(); ++i) {
      const double moved = mean(abs(eager.adapters[i] - eager.initial[i])).item();
      const double apart = mean(abs(comp.adapters[i] - eager.adapters[i])).item();
      EXPECT_GT(moved, 1e-3) << "adapter " << i;
      EXPECT_LT(apart, 0.5 * moved) << "adapter " << i;
    }
  }
  EXPECT_GT(std::abs(eager.losses[5] - eager.losses[0]), 1e-3 * std::abs(eager.losses[0])) << "the adapters must train";
}

// Results of a replay are the caller's own: keeping one across later calls (as a loss history does) must not
// see it overwritten by the next replay, and new args are copied into the captured input buffers.
TEST(CompileCudaStep, ReduceOverheadResultsSurviveLaterReplays) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  CompileOptions o = fresh_cache(dir);
  o.mode = CompileMode::ReduceOverhead;
  manual_seed(3);
  Tensor w = randn({64, 32}).to(kGpu);
  auto fn = [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{sum(relu(matmul(a[0], w)) * 0.5)}; };
  CompiledFunction f = compile(fn, o);
  std::vector<Tensor> kept;
  std::vector<double> want;
  for (int i = 0; i < 6; ++i) {
    Tensor x = randn({16, 64}).to(kGpu);
    want.push_back(fn({x})[0].item());
    kept.push_back(f({x})[0]);
  }
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_NEAR(kept[i].item(), want[i], 1e-4 * std::abs(want[i])) << "call " << i;
  EXPECT_EQ(f.stats().cuda_graph_fallback, "");
  EXPECT_EQ(f.stats().cuda_graphs, 1);
  EXPECT_EQ(f.stats().cuda_graph_host_steps, 0);
}

// Issue 24: a replayed call's peak counts the CUDA graphs' pool (Note [Pools held for CUDA graphs]). The product,
// freed during the capture, is free in the allocator's eyes, yet every replay writes it; before, a replayed 8B LoRA
// step printed 15.10 GiB of the 32 GiB it held. Each call's peak is taken as the trainer takes it: reset before the
// call, read once its result is on the host.
TEST(CompileCudaStep, ReduceOverheadReplayPeakCountsTheGraphsPool) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  manual_seed(5);
  Tensor w = randn({512, 512}).to(kGpu);
  Tensor x = randn({8192, 512}).to(kGpu);  // its product with w: 16 MiB, more than the rest of the call
  const int64_t product_bytes = 8192 * 512 * 4;
  auto fn = [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{sum(relu(matmul(a[0], w)) * 0.5)}; };
  Allocator& alloc = allocator_for(kGpu);
  struct Calls {
    std::vector<int64_t> peaks;
    int64_t graph_pool_bytes = 0;  // after the last call
    CompileStats stats;
  };
  auto run = [&](CompileMode mode) {
    CompileOptions o = fresh_cache(dir);
    o.mode = mode;
    CompiledFunction f = compile(fn, o);
    Calls c;
    for (int i = 0; i < 5; ++i) {
      alloc.reset_peak();
      f({x})[0].item();
      c.peaks.push_back(alloc.stats().peak_allocated_bytes);
    }
    c.graph_pool_bytes = alloc.stats().graph_pool_bytes;
    EXPECT_LE(c.peaks.back(), alloc.stats().reserved_bytes) << "every byte counted is held from the system";
    c.stats = f.stats();
    return c;
  };
  // Default: call 1 traces, the others execute. Reduce-overhead: 1 traces, 2 warms up, 3 captures, 4 and 5 replay.
  const Calls plain = run(CompileMode::Default);
  const Calls graphs = run(CompileMode::ReduceOverhead);
  ASSERT_EQ(graphs.stats.cuda_graph_fallback, "");
  ASSERT_EQ(graphs.stats.cuda_graphs, 1);
  EXPECT_EQ(plain.graph_pool_bytes, 0);
  EXPECT_GE(graphs.graph_pool_bytes, product_bytes) << "the freed product stays the graph's";
  EXPECT_EQ(alloc.stats().graph_pool_bytes, 0) << "the pool is let go with the graphs";
  for (int i : {3, 4}) {
    EXPECT_GE(graphs.peaks[i], graphs.peaks[2]) << "replay " << i + 1 << " holds what the capture held";
    EXPECT_GE(graphs.peaks[i], plain.peaks[i]) << "replay " << i + 1 << " holds at least the call without graphs";
  }
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  std::printf("[ peaks    ] default %.1f MiB; reduce-overhead: capture %.1f, replay %.1f (graph pool %.1f) MiB\n",
              mib(plain.peaks[4]), mib(graphs.peaks[2]), mib(graphs.peaks[4]), mib(graphs.graph_pool_bytes));
}

}  // namespace
// train.master_weights: false on a GPU: bf16 weights updated by AdamW's generated kernel (default and
// reduce-overhead) and by AdamW8bit's eager kernel inside the graph round stochastically as the eager CUDA step and
// the CPU do (Note [Stochastic rounding], runtime/kernels/scalar_math.h): the same bits after six steps. The loss
// sum(p * c) has gradient c exactly, so only the updates can differ.
TEST(CompileCudaStep, Bf16WeightsWithoutMastersUpdateAsEagerAndTheCpuBitForBit) {
  INGOT_REQUIRE_CUDA();
  const Bf16UpdateCase c = bf16_update_case(300, 70001);
  for (bool eight_bit : {false, true}) {
    const Bf16UpdateRun cpu = c.train(eight_bit, Device::cpu(), std::nullopt);
    for (std::optional<CompileMode> mode : {std::optional<CompileMode>(), std::optional(CompileMode::Default),
                                            std::optional(CompileMode::ReduceOverhead)}) {
      SCOPED_TRACE(std::string(eight_bit ? "AdamW8bit " : "AdamW ") + (!mode ? "eager"
                                                                       : *mode == CompileMode::Default
                                                                           ? "default"
                                                                           : "reduce-overhead"));
      const Bf16UpdateRun gpu = c.train(eight_bit, kGpu, mode);
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(count_unequal(gpu.first_grads[i], cpu.first_grads[i]), 0) << "first gradient of parameter " << i;
        EXPECT_EQ(count_unequal(gpu.after_first[i], cpu.after_first[i]), 0) << "after step 1, parameter " << i;
        EXPECT_EQ(count_unequal(gpu.final[i], cpu.final[i]), 0) << "after 6 steps, parameter " << i;
      }
      EXPECT_GT(count_unequal(gpu.final[1], c.start[1]), 1000) << "the weight hardly moved";
    }
  }
}

}  // namespace ingot::testing
