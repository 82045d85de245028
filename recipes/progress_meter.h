// What the training loop reports about its steps, apart from the loop itself: each step's metrics.jsonl record
// (through RunOutputs), the progress line every train.log_every steps, and at the end the summary's throughput
// and the "done" line. The meter keeps the run's training time: the steps only (a checkpoint or an eval between
// them does not count), added to what earlier processes of a resumed run spent.
//
//   ProgressMeter meter(opts, outputs, log);
//   for (...) { meter.begin_step(); ...; meter.stop_clock(); ...; meter.log_step({step, loss, lr, gnorm, peak}); }
//   meter.summarize(r);  ...;  meter.log_done(r);
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>

#include "recipes/train_loop.h"

namespace ingot::recipes {

class RunOutputs;

struct ProgressOptions {
  int64_t start_step = 0;       // the step a resumed run continues after (0: a fresh run)
  int64_t max_steps = 0;
  int64_t log_every = 1;        // train.log_every
  double tokens_per_step = 0;   // over all ranks and micro-batches
  double flops_per_token = 0;   // 0: no MFU
  double peak_flops = 0;        // the peak FLOP/s of all ranks' devices together (0: no MFU)
  bool compiled = false;        // the first step traces and compiles, so it is left out of the ETA
  double earlier_train_s = 0;   // training time of the processes before a resume
};

// One finished optimizer step as the loop measured it.
struct StepReport {
  int64_t step = 0;             // 1-based
  double loss = 0;              // averaged over the ranks
  double lr = 0;
  double grad_norm = -1;        // < 0: not measured
  int64_t peak_memory_bytes = 0;  // the allocator's high-water mark during the step
};

class ProgressMeter {
 public:
  // `outputs` is null on ranks that write nothing (the line then goes to their quiet `log`).
  ProgressMeter(const ProgressOptions& o, RunOutputs* outputs, std::ostream& log);

  // Around each step's compute: the time between the two is the step's training time.
  void begin_step();
  void stop_clock();
  // Writes the step's metrics record and, on the first step of this process, every log_every steps and the
  // last, the progress line (window averages since the previous line).
  void log_step(const StepReport& s);

  double this_process_s() const { return train_s_; }
  double total_train_s() const { return o_.earlier_train_s + train_s_; }
  int64_t peak_memory_bytes() const { return run_peak_; }  // the highest step peak of this process

  // Fills r.train_s and, when this process trained, r.tokens_per_s and r.mfu (r.steps is the last step).
  void summarize(TrainSummary& r) const;
  // "done | 40 steps in 0:11 | loss 10.9 -> 6.2 | 12.3k tok/s | saved <first checkpoint>"
  void log_done(const TrainSummary& r) const;

 private:
  using Clock = std::chrono::steady_clock;
  ProgressOptions o_;
  RunOutputs* outputs_;
  std::ostream& log_;
  Clock::time_point step_start_, window_start_;
  double train_s_ = 0, last_step_s_ = 0;
  double first_step_s_ = 0;  // this process's first step: with compile.enabled it traces and compiles
  double window_loss_ = 0;
  int64_t window_steps_ = 0, window_peak_ = 0, run_peak_ = 0, clocked_steps_ = 0;
};

}  // namespace ingot::recipes
