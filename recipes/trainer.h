// run_training's loop (recipes/train_loop.h) in parts. A Trainer is built from
//   a TrainStep      one optimizer step: eager or compiled, alone, under DDP or ZeRO-1/2/3 (recipes/train_step.h);
//   a CheckpointIO   the run's training checkpoints, plain, ZeRO-1 or sharded, and resuming from them
//                    (recipes/checkpoint_io.h);
//   a ProgressMeter  each step's metrics record, the progress line, throughput and MFU (recipes/progress_meter.h);
// and what those share: the data-parallel process group (recipes/data_parallel.h), the optimizer (over the f32
// masters of a bf16/f16 run), the LR schedule, the f16 loss scaler, the prefetched batches and the run's outputs
// (recipes/run_outputs.h). Building a Trainer joins the process group, wraps the model, resumes and prints the
// banner; train() runs the steps with their evals and checkpoints; finish() adds the final figures and eval.
// Writing the final artifacts and the summary is run_training's.
//
//   Trainer t(run, opts, task, log);
//   if (!t.train()) return t.summary();   // TrainTask::halt_after_steps stopped it
//   t.finish();
//   ... export the weights (t.dp(), t.masters()), t.outputs()->finish(t.summary()), t.meter().log_done(...)
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <ostream>
#include <vector>

#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "recipes/run_settings.h"
#include "recipes/train_loop.h"

namespace ingot::recipes {

class BatchPrefetcher;
class CheckpointIO;
class DataParallel;
class ProgressMeter;
class RunOutputs;
class TrainStep;
struct MemoryAdviceInput;
struct TrainState;

class Trainer {
 public:
  // Joins the job's process group (when launched as one), casts the model to run.dtype, wraps it for data
  // parallelism (filling shard-wise weights on a fresh start), builds the optimizer, resumes from
  // run.resume_checkpoint and logs the banner. `run`, `opts` and `task` outlive the Trainer.
  Trainer(const RunSettings& run, const TrainOptions& opts, TrainTask& task, std::ostream& log);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // The steps after the starting one up to run.max_steps, each followed by an eval every train.eval_every
  // steps and a checkpoint every checkpoint.save_every steps (and after the last). Returns false when
  // task.halt_after_steps stopped it, as if the process had died (summary() then holds the steps' figures).
  bool train();
  // After train(): throughput and MFU, the final eval (task.evaluate), the peak memory and the compiler's
  // statistics (logged), all into summary().
  void finish();

  TrainSummary& summary() { return r_; }
  DataParallel* dp() const { return dp_.get(); }                 // null without data parallelism
  optim::MasterWeights* masters() const { return masters_.get(); }  // bf16/f16: the f32 masters, else null
  CheckpointIO& checkpoints() { return *checkpoints_; }
  RunOutputs* outputs() const { return outputs_.get(); }          // rank 0 (or the only process), else null
  const ProgressMeter& meter() const { return *meter_; }
  int64_t start_step() const { return start_step_; }              // 0, or the step a resume continues after
  std::ostream& log() const { return *log_; }                     // rank 0's log; a null stream on the others

 private:
  // Cast, wrap, masters, optimizer and schedule; returns the 'loading |' line (or "").
  std::string set_up_parameters();
  // Restores the checkpoint's state (a fresh run gets step 0) and logs the banner.
  TrainState resume(const std::string& load_note);
  // One step's batch, TrainStep and progress record; returns the step's learning rate.
  double run_step(int64_t step);
  MemoryAdviceInput advice_input() const;  // what recipes/memory_advice.h reads of this run
  void record_loss(int64_t step, double loss);
  // The eval and checkpoint due after step `done`; false when the run halts there.
  bool after_step(int64_t done, double lr);

  class NullStream : public std::ostream {
   public:
    NullStream() : std::ostream(nullptr) {}
  };

  const RunSettings& run_;
  const TrainOptions& o_;
  TrainTask& task_;
  NullStream quiet_;
  std::ostream* log_ = nullptr;
  // Declared first among the parts so that it goes last: the others may still run collectives as they go.
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<optim::LossScaler> scaler_;  // f16 only
  optim::OptimizerSpec spec_;
  std::unique_ptr<CheckpointIO> checkpoints_;
  std::unique_ptr<optim::MasterWeights> masters_;
  std::vector<Tensor> opt_params_;  // what the optimizer updates: the masters, or the (sharded) parameters
  std::unique_ptr<optim::Optimizer> opt_;
  optim::LrSchedule sched_;
  TrainSummary r_;
  int64_t start_step_ = 0, saved_step_ = 0;
  // Where the data stands after the batches of the steps done so far: the live position runs one step ahead
  // once the next batch is prefetched (Note [Prefetching the next batch], prefetch.h).
  int64_t consumed_position_ = 0;
  std::unique_ptr<TrainStep> step_;
  std::unique_ptr<RunOutputs> outputs_;
  std::unique_ptr<ProgressMeter> meter_;
  std::unique_ptr<BatchPrefetcher> prefetch_;
};

}  // namespace ingot::recipes
