// A tiny model + AdamW training step, runnable eagerly or compiled, for the compiler tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compile/api.h"
#include "models/tiny_models.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "runtime/rng.h"
#include "tests/testing.h"

namespace ingot::testing {

struct StepRun {
  std::vector<double> losses;
  std::vector<Tensor> params;  // final values (copies)
  CompileStats stats;
};

// Trains `make_model()` for `steps` AdamW steps on a repeating batch with a warm-up + cosine schedule, eagerly
// or through ingot::compiler; the whole step (forward, backward, update, zero_grad) is the compiled function.
// The model is initialised on the CPU (same weights for every device) and moved to `dev`; `prepare` runs
// after the move (e.g. set_compute_dtype).
struct NoPrepare {
  template <class M>
  void operator()(M&) const {}
};
template <class MakeModel, class Prepare = NoPrepare>
StepRun train_steps(MakeModel make_model, bool compiled, int steps, CompileOptions opts = {}, int64_t B = 2,
                    int64_t T = 8, Device dev = Device::cpu(), Prepare prepare = {}) {
  manual_seed(7);
  auto model = make_model();
  if (!dev.is_cpu()) model->to(dev);
  prepare(model);
  std::vector<Tensor> trained;  // all of them, or a LoRA model's adapters
  for (const Tensor& p : model->parameters())
    if (p.requires_grad()) trained.push_back(p);
  optim::AdamW opt(trained, optim::AdamWOptions{3e-3, 0.9, 0.95, 1e-8, 0.1});
  optim::LrSchedule sched;
  sched.kind = optim::LrSchedule::Kind::Cosine;
  sched.base_lr = 3e-3;
  sched.min_lr = 3e-4;
  sched.warmup_steps = 3;
  sched.total_steps = steps;
  auto [ids_cpu, tgt_cpu] = repeating_batch(B, T);
  Tensor ids = ids_cpu.to(dev), tgt = tgt_cpu.to(dev);
  auto fn = [&](const std::vector<Tensor>& batch) {
    Tensor loss = model->loss(batch[0], batch[1]);
    loss.backward();
    opt.step();
    opt.zero_grad();
    return std::vector<Tensor>{loss};
  };
  CompiledFunction step = compile(fn, opts);
  StepRun r;
  for (int i = 0; i < steps; ++i) {
    opt.set_lr(sched.at(i));
    std::vector<Tensor> out = compiled ? step({ids, tgt}) : fn({ids, tgt});
    r.losses.push_back(out[0].item());
  }
  for (const Tensor& p : model->parameters()) r.params.push_back(p.to(Device::cpu()).clone_raw());
  r.stats = step.stats();
  return r;
}

// Tolerance: node by node (backend eager) the graph runs eager's kernels in eager's order, so results are
// identical. With generated kernels, fused expressions round differently (no intermediate stores, expanded
// activation gradients); AdamW divides by sqrt(v), which amplifies those last-bit differences for parameters
// with tiny gradients, so after 20 steps parameters agree to rtol 1e-3 + atol 1e-4 and losses to 1e-4
// relative.
inline void expect_same_training(const StepRun& eager, const StepRun& comp, double rtol = 1e-3, double atol = 1e-4) {
  ASSERT_EQ(eager.losses.size(), comp.losses.size());
  for (size_t i = 0; i < eager.losses.size(); ++i)
    EXPECT_NEAR(comp.losses[i], eager.losses[i], 1e-4 * std::abs(eager.losses[i])) << "step " << i;
  ASSERT_EQ(eager.params.size(), comp.params.size());
  double worst = 0;
  for (size_t k = 0; k < eager.params.size(); ++k) {
    const double e = max_rel_error(comp.params[k], eager.params[k], rtol, atol);
    worst = std::max(worst, e);
    EXPECT_LE(e, 1.0) << "parameter " << k;
  }
  std::printf("[ compare  ] worst parameter error %.3g of the tolerance (rtol %g, atol %g)\n", worst, rtol, atol);
  EXPECT_LT(eager.losses.back(), eager.losses.front() - 0.5) << "the run must actually train";
}

inline auto tiny_gpt2() { return std::make_shared<models::GPT2>(tiny_gpt2_config()); }

// A step to trace: {ids, targets} -> {loss, then every parameter's gradient}, leaving the gradients cleared.
template <typename Model>
auto loss_and_grads(const std::shared_ptr<Model>& model) {
  return [model](const std::vector<Tensor>& a) {
    Tensor loss = model->loss(a[0], a[1]);
    loss.backward();
    std::vector<Tensor> r{loss};
    for (Tensor p : model->parameters()) {
      r.push_back(p.grad());
      p.zero_grad();
    }
    return r;
  };
}
inline auto tiny_llama() { return std::make_shared<models::Llama>(tiny_llama_config()); }

// A linear head over `vocab` classes and its cross-entropy, whose [n, vocab] f32 logits are the step's largest
// value (the buffer-reuse tests): {x, targets} -> {loss, dw}, leaving the gradient cleared.
struct LinearHeadStep {
  Tensor w, x, t;  // w [vocab, d] with a gradient; x [n, d] and t [n] the arguments
  std::vector<Tensor> operator()(const std::vector<Tensor>& a) {
    Tensor loss = cross_entropy(linear(a[0], w, Tensor()), a[1]);
    loss.backward();
    Tensor g = w.grad();
    w.zero_grad();
    return {loss, g};
  }
};
inline LinearHeadStep linear_head_step(uint64_t seed, int64_t n, int64_t vocab, int64_t d) {
  manual_seed(seed);
  LinearHeadStep s;
  s.w = randn({vocab, d}).set_requires_grad(true);
  s.x = randn({n, d});
  s.t = randint(0, vocab, {n});
  return s;
}

// train.master_weights: false, isolated: two bf16 weights of magnitude ~0.02 (n0 and n1 elements) updated by AdamW or
// AdamW8bit for six steps of the loss sum(p0 * c0) + sum(p1 * c1), whose gradient is c exactly, so only the updates
// can differ between devices or modes. Everything returned is a CPU copy.
struct Bf16UpdateRun {
  std::vector<Tensor> first_grads, after_first, final;  // the first (eager or traced) step's, then the last
  std::string graph;                                    // the compiled graph (empty when eager)
};
struct Bf16UpdateCase {
  std::vector<Tensor> start;                 // bf16 weights
  std::vector<std::vector<Tensor>> batches;  // six (c0, c1), bf16
  // `mode` unset: eager steps.
  Bf16UpdateRun train(bool eight_bit, Device d, std::optional<CompileMode> mode) const {
    // Copies: on the CPU .to() hands back the tensor itself, which the update (or a later step) would change.
    auto cpu_copy = [](const Tensor& t) { return t.to(Device::cpu()).clone_raw(); };
    std::vector<Tensor> ps = {leaf(start[0].clone_raw().to(d)), leaf(start[1].clone_raw().to(d))};
    const optim::AdamWOptions o{.lr = 1e-4, .weight_decay = 0.1};
    std::unique_ptr<optim::Optimizer> opt;
    if (eight_bit)
      opt = std::make_unique<optim::AdamW8bit>(ps, o);
    else
      opt = std::make_unique<optim::AdamW>(ps, o);
    Bf16UpdateRun r;
    auto fn = [&](const std::vector<Tensor>& c) {
      Tensor loss = add(sum(mul(ps[0], c[0])), sum(mul(ps[1], c[1])));
      loss.backward();
      if (r.first_grads.empty()) r.first_grads = {cpu_copy(ps[0].grad()), cpu_copy(ps[1].grad())};
      opt->step();
      if (r.after_first.empty()) r.after_first = {cpu_copy(ps[0]), cpu_copy(ps[1])};
      opt->zero_grad();
      return std::vector<Tensor>{loss};
    };
    CompileOptions co;
    if (mode) co.mode = *mode;
    CompiledFunction step = compile(fn, co);
    for (const auto& b : batches) mode ? step({b[0].to(d), b[1].to(d)}) : fn({b[0].to(d), b[1].to(d)});
    r.final = {cpu_copy(ps[0]), cpu_copy(ps[1])};
    if (mode) r.graph = step.stats().last_graph;
    return r;
  }
};
inline Bf16UpdateCase bf16_update_case(int64_t n0, int64_t n1) {
  manual_seed(5);
  Bf16UpdateCase c;
  c.start = {mul(randn({n0}), 0.02).to(DType::bf16), mul(randn({n1}), 0.02).to(DType::bf16)};
  for (int i = 0; i < 6; ++i) c.batches.push_back({randn({n0}).to(DType::bf16), randn({n1}).to(DType::bf16)});
  return c;
}

}  // namespace ingot::testing
