// A tiny model + AdamW training step, runnable eagerly or compiled, for the compiler tests.
#pragma once

#include <memory>
#include <vector>

#include "compile/api.h"
#include "models/tiny_models.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "runtime/rng.h"

namespace ingot::testing {

struct StepRun {
  std::vector<double> losses;
  std::vector<Tensor> params;  // final values (copies)
  CompileStats stats;
};

// Trains `make_model()` for `steps` AdamW steps on a repeating batch with a warm-up + cosine schedule, eagerly
// or through ingot::compiler; the whole step (forward, backward, update, zero_grad) is the compiled function.
template <class MakeModel>
StepRun train_steps(MakeModel make_model, bool compiled, int steps, CompileOptions opts = {}, int64_t B = 2,
                    int64_t T = 8) {
  manual_seed(7);
  auto model = make_model();
  optim::AdamW opt(model->parameters(), optim::AdamWOptions{3e-3, 0.9, 0.95, 1e-8, 0.1});
  optim::LrSchedule sched;
  sched.kind = optim::LrSchedule::Kind::Cosine;
  sched.base_lr = 3e-3;
  sched.min_lr = 3e-4;
  sched.warmup_steps = 3;
  sched.total_steps = steps;
  auto [ids, tgt] = repeating_batch(B, T);
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
  for (const Tensor& p : model->parameters()) r.params.push_back(p.clone_raw());
  r.stats = step.stats();
  return r;
}

inline auto tiny_gpt2() { return std::make_shared<models::GPT2>(tiny_gpt2_config()); }
inline auto tiny_llama() { return std::make_shared<models::Llama>(tiny_llama_config()); }

}  // namespace ingot::testing
