// What one optimizer step does, apart from the loop around it: every micro-batch's forward and backward (scaled
// for gradient accumulation, token weights and the f16 loss scale), the gradient norm and clipping, the
// optimizer update and the master-weight copies. Eager, or compiled (compile.enabled): the first run() traces
// the whole step into one graph (compile/api.h), and the clip then stays on the device instead of reading the
// norm back to the host. Data parallelism (DDP, ZeRO-1/2/3) is the caller's wrap (recipes/data_parallel.h);
// the step only calls its backward, synchronize and after_step.
//
//   TrainStep step({.opts = o, .task = task, .dp = dp, .opt = opt, ...}, run.compile, log);
//   TrainStep::Result out = step.run(batch);   // batch: see run()
//   double l = out.loss.item();  double gnorm = out.grad_norm();
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <vector>

#include "compile/api.h"
#include "optim/loss_scaler.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "recipes/run_settings.h"
#include "recipes/train_loop.h"

namespace ingot::recipes {

class DataParallel;

// What a step works on; all of it outlives the TrainStep.
struct TrainStepParts {
  const TrainOptions& opts;                      // grad_accum, grad_clip
  TrainTask& task;                               // loss, model, positions
  DataParallel* dp = nullptr;                    // null without data parallelism; already wrapped
  optim::Optimizer& opt;
  optim::MasterWeights* masters = nullptr;       // bf16/f16: the f32 masters the optimizer updates
  optim::LossScaler* scaler = nullptr;           // f16 only
  const std::vector<Tensor>& opt_params;         // what the optimizer updates (masters or this rank's shards)
};

class TrainStep {
 public:
  // Compiles when c.enabled (logging the mode to `log`); nothing is traced before the first run().
  TrainStep(const TrainStepParts& parts, const CompileSettings& c, std::ostream& log);
  TrainStep(const TrainStep&) = delete;  // the compiled function calls back into this object
  TrainStep& operator=(const TrainStep&) = delete;
  ~TrainStep();

  struct Result {
    Tensor loss;               // this rank's mean loss over the step's micro-batches (on the device)
    Tensor norm;               // compiled with clipping: the gradient norm before clipping, else undefined
    double host_norm = -1;     // eager: the norm measured on the host; compiled: -1 (not measured)
    bool skipped = false;      // f16: the gradients overflowed, so the update was skipped and the scale lowered
    double loss_scale = 0;     // f16: the scale this step ran with (0 otherwise)
    // The gradient norm before clipping; < 0 when not measured. Reads a compiled norm back from the device, so
    // the loop asks for it after the loss.
    double grad_norm() const { return norm.defined() ? norm.item() : host_norm; }
  };
  // One optimizer step over `batch`, the flat list of the step's micro-batches on the device: (inputs, targets)
  // or, with task.positions, (inputs, targets, positions) per micro-batch, then under data parallelism with
  // task.loss_tokens each micro-batch's weight ([grad_accum], 1 / grad_accum folded in) as the last tensor.
  Result run(const std::vector<Tensor>& batch);

  // The compiled step (for its statistics), or null when eager.
  const CompiledFunction* compiled() const { return compiled_ ? &*compiled_ : nullptr; }

 private:
  // Returns {total loss} or, when traced with clipping, {total loss, norm before clipping}.
  std::vector<Tensor> body(const std::vector<Tensor>& batch, bool traced);
  // One process with train.optimizer_in_backward: Note [Each parameter updated in its backward] (train_step.cpp).
  void update_each_parameter_in_backward();

  TrainStepParts p_;
  bool sharded_ = false;
  double host_norm_ = -1;
  bool skipped_ = false;
  bool in_backward_ = false;                          // train.optimizer_in_backward: the backward updates
  std::shared_ptr<optim::Optimizer*> hook_owner_;     // what the per-parameter hooks reach while this step lives
  std::optional<CompiledFunction> compiled_;
};

}  // namespace ingot::recipes
