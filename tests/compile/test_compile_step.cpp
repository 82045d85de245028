// The whole training step compiled into one graph gives eager's losses and parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "compile/step_fixture.h"
#include "optim/clip.h"
#include "optim/mixed_precision.h"
#include "runtime/allocator.h"

namespace ingot::testing {
namespace {

TEST(CompileStep, TinyGpt2TwentyAdamWStepsMatchEager) {
  StepRun eager = train_steps(tiny_gpt2, false, 20);
  StepRun comp = train_steps(tiny_gpt2, true, 20);
  expect_same_training(eager, comp);
  EXPECT_EQ(comp.stats.compiles, 1);
  EXPECT_EQ(comp.stats.recompiles, 0);
  EXPECT_TRUE(comp.stats.graph_breaks.empty());
  EXPECT_EQ(comp.stats.compiled_calls, 19);  // the first call traces (and runs eagerly)
}

TEST(CompileStep, NodeByNodeExecutionIsBitIdenticalToEager) {
  CompileOptions o;
  o.backend = CompileBackend::Eager;
  StepRun eager = train_steps(tiny_gpt2, false, 5);
  StepRun comp = train_steps(tiny_gpt2, true, 5, o);
  expect_same_training(eager, comp, 0.0, 0.0);
  EXPECT_EQ(comp.stats.kernels, 0);
}

TEST(CompileStep, FusedKernelsFarFewerThanEagerOps) {
  StepRun comp = train_steps(tiny_gpt2, true, 2);
  std::printf("[ kernels  ] traced ops %lld (%lld not views), after passes %lld, groups %lld, generated kernels %lld, "
              "launches %lld\n",
              static_cast<long long>(comp.stats.ops_before), static_cast<long long>(comp.stats.compute_ops),
              static_cast<long long>(comp.stats.ops_after),
              static_cast<long long>(comp.stats.fused_groups), static_cast<long long>(comp.stats.kernels),
              static_cast<long long>(comp.stats.launches));
  // Matmuls, attention, embedding and the norm/loss backward kernels stay extern (eager kernels); everything
  // else runs as generated kernels, so a step launches well under 70% of what eager launches.
  EXPECT_GE(comp.stats.kernels, 20);
  EXPECT_LT(comp.stats.launches * 10, comp.stats.compute_ops * 7);
}

// Peak bytes the CPU allocator sees during one more step, after `steps` steps (eager or compiled).
template <class MakeModel>
int64_t step_peak(MakeModel make_model, bool compiled, CompileOptions opts) {
  manual_seed(3);
  auto model = make_model();
  optim::AdamW opt(model->parameters());
  auto [ids, tgt] = repeating_batch(16, 16);
  auto fn = [&](const std::vector<Tensor>& b) {
    Tensor loss = model->loss(b[0], b[1]);
    loss.backward();
    opt.step();
    opt.zero_grad();
    return std::vector<Tensor>{loss};
  };
  CompiledFunction step = compile(fn, opts);
  for (int i = 0; i < 2; ++i) compiled ? step({ids, tgt}) : fn({ids, tgt});
  cpu_allocator().reset_peak();
  compiled ? step({ids, tgt}) : fn({ids, tgt});
  return cpu_allocator().stats().peak_allocated_bytes;
}

TEST(CompileStep, MemoryBudgetBringsThePeakBelowEagers) {
  CompileOptions o;
  o.memory_budget = 0.3;  // recompute cheap saved activations (GELU outputs) in the backward
  o.split_update = true;   // and update each parameter as soon as its gradient is complete
  const int64_t eager = step_peak(tiny_gpt2, false, {});
  const int64_t compiled = step_peak(tiny_gpt2, true, o);
  std::printf("[ memory   ] peak during a step: eager %lld bytes, compiled (memory_budget 0.3) %lld bytes\n",
              static_cast<long long>(eager), static_cast<long long>(compiled));
  EXPECT_LT(compiled, eager);
  StepRun e = train_steps(tiny_gpt2, false, 5);
  StepRun c = train_steps(tiny_gpt2, true, 5, o);
  expect_same_training(e, c);
}

TEST(CompileStep, SgdWithMomentumMatchesEager) {
  auto run = [](bool compiled) {
    manual_seed(5);
    auto model = tiny_gpt2();
    optim::SGD opt(model->parameters(), optim::SGDOptions{0.05, 0.9, 0.0, 0.01, true});
    auto [ids, tgt] = repeating_batch(2, 8);
    auto fn = [&](const std::vector<Tensor>& b) {
      Tensor loss = model->loss(b[0], b[1]);
      loss.backward();
      opt.step();
      opt.zero_grad();
      return std::vector<Tensor>{loss};
    };
    CompiledFunction step = compile(fn);
    std::vector<double> losses;
    for (int i = 0; i < 6; ++i) losses.push_back((compiled ? step({ids, tgt}) : fn({ids, tgt}))[0].item());
    return losses;
  };
  std::vector<double> e = run(false), c = run(true);
  for (size_t i = 0; i < e.size(); ++i) EXPECT_NEAR(c[i], e[i], 1e-4 * std::abs(e[i])) << "step " << i;
}

// Note [Traced updates run in place] (optim/fused_update.h): the step that traces runs the optimizer update over
// the parameters and state, as eager step() does, instead of making their updated copies first (an 8B ZeRO-3
// step's first call held 48 GB more than the later ones). Parameters whose loss is sum(w * x): the traced call
// holds the gradients, the trace's .grad clones and a few scalars above what it held before; with the functional
// update it also held every updated parameter and its state (in parameters' bytes, 2.0 in place: AdamW 4.0, SGD
// with momentum 3.0, AdamW8bit 2.5; Lion, whose update is made of tensor ops, runs one parameter at a time: 2.25 of
// 8 parameters' bytes in place, 4.0 functionally). And the compiled steps after it still follow eager ones.
TEST(CompileStep, TheTracedUpdateMakesNoSecondCopyOfTheParametersAndState) {
  for (const std::string kind : {"adamw", "sgd", "adamw8bit", "lion"}) {
    SCOPED_TRACE(kind);
    // Lion's per-parameter temporaries (cast gradient, moment mix, sign) show only with several parameters.
    const int64_t count = kind == "lion" ? 8 : 1, rows = 512 / count;
    auto run = [&](bool compiled, int64_t* traced_extra) {
      manual_seed(11);
      std::vector<Tensor> ws, xs;
      for (int64_t i = 0; i < count; ++i) {
        ws.push_back(randn({rows, 512}));
        ws.back().set_requires_grad(true);
      }
      std::unique_ptr<optim::Optimizer> opt;
      if (kind == "sgd") opt = std::make_unique<optim::SGD>(ws, optim::SGDOptions{0.05, 0.9, 0.0, 0.0});
      else if (kind == "adamw8bit") opt = std::make_unique<optim::AdamW8bit>(ws, optim::AdamWOptions{});
      else if (kind == "lion") opt = std::make_unique<optim::Lion>(ws, optim::LionOptions{});
      else opt = std::make_unique<optim::AdamW>(ws, optim::AdamWOptions{});
      auto fn = [&](const std::vector<Tensor>& b) {
        Tensor loss = sum(mul(ws[0], b[0]));
        for (int64_t i = 1; i < count; ++i) loss = add(loss, sum(mul(ws[static_cast<size_t>(i)], b[0])));
        loss.backward();
        opt->step();
        opt->zero_grad();
        return std::vector<Tensor>{loss};
      };
      CompiledFunction step = compile(fn);
      const Tensor x = randn({rows, 512});
      std::vector<double> out;
      out.push_back(fn({x})[0].item());  // eager first: the state exists before the trace
      for (int i = 1; i < 5; ++i) {
        const int64_t before = cpu_allocator().stats().allocated_bytes;
        cpu_allocator().reset_peak();
        out.push_back((compiled ? step({x}) : fn({x}))[0].item());
        if (i == 1 && traced_extra) *traced_extra = cpu_allocator().stats().peak_allocated_bytes - before;
      }
      for (const Tensor& w : ws)
        for (double v : w.to_vector()) out.push_back(v);
      return out;
    };
    int64_t extra = 0;
    const std::vector<double> e = run(false, nullptr), c = run(true, &extra);
    const int64_t params = 512 * 512 * 4;
    std::printf("[ traced   ] %s: the traced call's peak above what was held before it: %lld B (%.2f parameters' bytes)\n",
                kind.c_str(), static_cast<long long>(extra), static_cast<double>(extra) / params);
    EXPECT_LT(extra, (kind == "lion" ? 12 : 9) * params / 4);
    ASSERT_EQ(c.size(), e.size());
    // The losses sum 262,144 products: the compiled reduction's order moves them by ~1e-5 relative.
    for (size_t i = 0; i < e.size(); ++i) ASSERT_NEAR(c[i], e[i], 1e-4 * (1 + std::abs(e[i]))) << "value " << i;
  }
}

// AdamW8bit's traced update splits as AdamW's does (SplittableUpdate, autograd/primitive_multi_tensor.h): under
// split_update each parameter's 8-bit update runs right after its gradient is made, so a replay holds about one
// gradient at a time instead of all eight, and the results stay the eager ones.
TEST(CompileStep, AdamW8bitsUpdateSplitsPerParameterSoEachGradientDiesAtItsUpdate) {
  const int64_t count = 8, rows = 64;  // 8 parameters of 32,768 elements: 8-bit state (4096 elements and more)
  auto run = [&](bool compiled, bool split, int64_t* replay_peak) {
    manual_seed(12);
    std::vector<Tensor> ws;
    for (int64_t i = 0; i < count; ++i) {
      ws.push_back(randn({rows, 512}));
      ws.back().set_requires_grad(true);
    }
    optim::AdamW8bit opt(ws, optim::AdamWOptions{.lr = 1e-2});
    auto fn = [&](const std::vector<Tensor>& b) {
      // Each gradient from its own input (one input for all would fuse their products into one kernel).
      Tensor loss = sum(mul(ws[0], b[0]));
      for (size_t i = 1; i < ws.size(); ++i) loss = add(loss, sum(mul(ws[i], b[i])));
      loss.backward();
      opt.step();
      opt.zero_grad();
      return std::vector<Tensor>{loss};
    };
    CompileOptions o;
    o.split_update = split;
    CompiledFunction step = compile(fn, o);
    std::vector<Tensor> xs;
    for (int64_t i = 0; i < count; ++i) xs.push_back(randn({rows, 512}));
    std::vector<double> out;
    for (int i = 0; i < 5; ++i) {
      cpu_allocator().reset_peak();
      const int64_t before = cpu_allocator().stats().allocated_bytes;
      out.push_back((compiled ? step(xs) : fn(xs))[0].item());
      if (i == 4 && replay_peak) *replay_peak = cpu_allocator().stats().peak_allocated_bytes - before;
    }
    for (const Tensor& w : ws)
      for (double v : w.to_vector()) out.push_back(v);
    return out;
  };
  int64_t whole = 0, parts = 0;
  const std::vector<double> e = run(false, false, nullptr), c = run(true, false, &whole), p = run(true, true, &parts);
  const int64_t grad_bytes = rows * 512 * 4;
  std::printf("[ memory   ] AdamW8bit replay's peak above what it held before: one update %lld B, split %lld B "
              "(a gradient is %lld B)\n",
              static_cast<long long>(whole), static_cast<long long>(parts), static_cast<long long>(grad_bytes));
  EXPECT_LT(parts + 4 * grad_bytes, whole) << "the split update frees the gradients as it goes";
  ASSERT_EQ(c.size(), e.size());
  ASSERT_EQ(p.size(), e.size());
  for (size_t i = 0; i < e.size(); ++i) {
    ASSERT_NEAR(c[i], e[i], 1e-4 * (1 + std::abs(e[i]))) << "value " << i;
    ASSERT_NEAR(p[i], e[i], 1e-4 * (1 + std::abs(e[i]))) << "value " << i;
  }
}

TEST(CompileStep, DynamicSequenceLengthNeverRecompiles) {
  auto run = [](bool compiled) {
    manual_seed(9);
    auto model = tiny_gpt2();
    optim::AdamW opt(model->parameters());
    auto fn = [&](const std::vector<Tensor>& b) {
      Tensor loss = model->loss(b[0], b[1]);
      loss.backward();
      opt.step();
      opt.zero_grad();
      return std::vector<Tensor>{loss};
    };
    CompileOptions o;
    o.dynamic = DynamicMode::True;
    CompiledFunction step = compile(fn, o);
    std::vector<double> losses;
    for (int64_t T : {8, 12, 8, 16, 12}) {
      auto [ids, tgt] = repeating_batch(2, T);
      losses.push_back((compiled ? step({ids, tgt}) : fn({ids, tgt}))[0].item());
    }
    return std::make_pair(losses, step.stats());
  };
  auto [e, es] = run(false);
  auto [c, cs] = run(true);
  for (size_t i = 0; i < e.size(); ++i) EXPECT_NEAR(c[i], e[i], 1e-4 * std::abs(e[i])) << "call " << i;
  EXPECT_EQ(cs.recompiles, 0);
  EXPECT_EQ(cs.specializations, 2) << "one per new sequence length (Note [Dynamic dims re-specialize])";
  EXPECT_EQ(cs.compiled_calls, 2) << "repeated lengths reuse their specialization";
}

TEST(CompileStep, Bf16ModelWithF32MasterWeightsMatchesEager) {
  auto run = [](bool compiled) {
    manual_seed(11);
    auto model = tiny_gpt2();
    model->to(DType::bf16);
    optim::MasterWeights mw(model->parameters());
    optim::AdamW opt(mw.master(), optim::AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.0});
    auto [ids, tgt] = repeating_batch(2, 8);
    auto fn = [&](const std::vector<Tensor>& b) {
      Tensor loss = model->loss(b[0], b[1]);
      loss.backward();
      mw.copy_grads_to_master();
      opt.step();
      mw.copy_to_model();
      model->zero_grad();
      opt.zero_grad();
      return std::vector<Tensor>{loss};
    };
    CompiledFunction step = compile(fn);
    std::vector<double> losses;
    for (int i = 0; i < 6; ++i) losses.push_back((compiled ? step({ids, tgt}) : fn({ids, tgt}))[0].item());
    return std::make_pair(losses, model->parameters()[0].clone_raw());
  };
  auto [e, ep] = run(false);
  auto [c, cp] = run(true);
  for (size_t i = 0; i < e.size(); ++i) EXPECT_NEAR(c[i], e[i], 2e-3 * std::abs(e[i])) << "step " << i;
  EXPECT_LT(e.back(), e.front()) << "the bf16 model trains";
  EXPECT_LE(max_rel_error(cp, ep, 2e-2, 1e-3), 1.0) << "bf16 model weights follow the masters";
}

TEST(CompileStep, DeviceSideGradClippingTracesWithoutABreak) {
  auto run = [](bool compiled) {
    manual_seed(13);
    auto model = tiny_gpt2();
    optim::AdamW opt(model->parameters());
    auto [ids, tgt] = repeating_batch(2, 8);
    auto fn = [&](const std::vector<Tensor>& b) {
      Tensor loss = model->loss(b[0], b[1]);
      loss.backward();
      Tensor norm = optim::clip_grad_norm_tensor(model->parameters(), 0.05);  // small: clipping is active
      opt.step();
      opt.zero_grad();
      return std::vector<Tensor>{loss, norm};
    };
    CompiledFunction step = compile(fn);
    std::vector<double> out;
    for (int i = 0; i < 5; ++i) {
      std::vector<Tensor> r = compiled ? step({ids, tgt}) : fn({ids, tgt});
      out.push_back(r[0].item());
      out.push_back(r[1].item());
    }
    return std::make_pair(out, step.stats());
  };
  auto [e, es] = run(false);
  auto [c, cs] = run(true);
  for (size_t i = 0; i < e.size(); ++i) EXPECT_NEAR(c[i], e[i], 1e-4 * std::abs(e[i])) << "value " << i;
  EXPECT_GT(e[1], 0.05) << "the norm exceeds max_norm, so the clip is exercised";
  EXPECT_TRUE(cs.graph_breaks.empty());
  EXPECT_EQ(cs.compiles, 1);
}

TEST(CompileStep, TinyLlamaTwentyAdamWStepsMatchEager) {
  StepRun eager = train_steps(tiny_llama, false, 20);
  StepRun comp = train_steps(tiny_llama, true, 20);
  expect_same_training(eager, comp);
  EXPECT_EQ(comp.stats.compiles, 1);
  EXPECT_TRUE(comp.stats.graph_breaks.empty());
}

// A model with dropout compiles into one graph: every step draws the same masks as the eager step would (the
// (seed, offset) pairs are host inputs that reserve the generator's draws at each replay).
TEST(CompileStep, DropoutModelTrainsLikeEagerInOneGraph) {
  auto with_dropout = [] {
    models::GPT2Config c = tiny_gpt2_config();
    c.dropout = 0.2;
    return std::make_shared<models::GPT2>(c);
  };
  StepRun eager = train_steps(with_dropout, false, 12);
  const uint64_t eager_offset = default_generator(Device::cpu()).offset();
  StepRun comp = train_steps(with_dropout, true, 12);
  EXPECT_EQ(default_generator(Device::cpu()).offset(), eager_offset) << "the generator advanced as in eager";
  expect_same_training(eager, comp);
  EXPECT_EQ(comp.stats.compiles, 1);
  EXPECT_TRUE(comp.stats.graph_breaks.empty());
  EXPECT_NE(comp.stats.last_graph.find("dropout("), std::string::npos);
}

TEST(CompileStep, TheWholeStepIsOneGraphWithForwardBackwardAndOneFusedUpdate) {
  StepRun comp = train_steps(tiny_gpt2, true, 2);
  const std::string& g = comp.stats.last_graph;
  EXPECT_NE(g.find("attention"), std::string::npos);
  EXPECT_NE(g.find("layer_norm_bwd"), std::string::npos) << "backward ops are in the graph";
  size_t updates = 0;
  for (size_t p = g.find("adamw_update("); p != std::string::npos; p = g.find("adamw_update(", p + 1)) ++updates;
  EXPECT_EQ(updates, 1u) << "one horizontal optimizer update over every parameter";
  EXPECT_NE(g.find("write-back"), std::string::npos);
  EXPECT_GT(comp.stats.ops_before, comp.stats.ops_after);
}

// train.master_weights: false. bf16 weights updated by AdamW (a generated kernel) and AdamW8bit (its eager kernel
// inside the graph) in a compiled step round stochastically exactly as the eager step does (Note [Stochastic
// rounding], runtime/kernels/scalar_math.h): the same bits after six steps. The loss sum(p * c) has gradient c
// exactly, so only the updates can differ.
TEST(CompileStep, Bf16WeightsWithoutMastersUpdateAsEagerBitForBit) {
  const Bf16UpdateCase c = bf16_update_case(300, 4200);
  for (bool eight_bit : {false, true}) {
    SCOPED_TRACE(eight_bit ? "AdamW8bit" : "AdamW");
    const Bf16UpdateRun eager = c.train(eight_bit, Device::cpu(), std::nullopt);
    const Bf16UpdateRun comp = c.train(eight_bit, Device::cpu(), CompileMode::Default);
    for (size_t i = 0; i < eager.final.size(); ++i) {
      EXPECT_EQ(comp.final[i].dtype(), DType::bf16);
      EXPECT_EQ(comp.final[i].to_vector(), eager.final[i].to_vector()) << "parameter " << i;
      EXPECT_NE(comp.final[i].to_vector(), c.start[i].to_vector()) << "parameter " << i << " never moved";
    }
    if (!eight_bit) {
      EXPECT_NE(comp.graph.find("adamw_update("), std::string::npos) << comp.graph;
    }
  }
}

}  // namespace
}  // namespace ingot::testing
