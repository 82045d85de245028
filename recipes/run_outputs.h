// Everything a training run writes besides weights and checkpoints, behind one object the loop calls:
// the JSONL metrics log, TensorBoard event files (logging.tensorboard), the per-op profile of chosen steps
// (profile.*), and at the end the loss-curve PNG (logging.plot). Paths end up in the run summary.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

#include "recipes/run_settings.h"
#include "recipes/train_loop.h"

namespace ingot::recipes {

class MetricsLog;
class EventWriter;
class OpProfiler;

class RunOutputs {
 public:
  // `resumed_step` >= 0 continues the logs of a resumed run after that step; -1 starts them fresh.
  RunOutputs(const RunSettings& run, int64_t resumed_step, std::ostream& log);
  ~RunOutputs();
  RunOutputs(const RunOutputs&) = delete;
  RunOutputs& operator=(const RunOutputs&) = delete;

  const std::string& metrics_path() const { return metrics_path_; }
  // Around each optimizer step (1-based): starts / stops the profiler on the configured steps.
  void begin_step(int64_t step);
  void end_step(int64_t step);
  // `json` is the full metrics.jsonl record of the step; the scalars also go to TensorBoard.
  // grad_norm < 0: not measured (not sent to TensorBoard).
  void log_train(const std::string& json, int64_t step, double loss, double lr, double grad_norm, double tokens_per_s);
  // The run failed: the metrics of steps after `saved_step` (its last checkpoint, 0 for none) move to
  // metrics.failed.jsonl, since no saved model holds them; says so in the log.
  void abandon(int64_t saved_step);
  void log_eval(int64_t step, double val_loss);
  // Draws the loss plot, closes the event file, and fills in the summary's output paths.
  void finish(TrainSummary& r);

 private:
  const RunSettings& run_;
  std::ostream& log_;
  std::string metrics_path_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<EventWriter> events_;
  std::unique_ptr<OpProfiler> profiler_;
  std::string trace_path_;
};

}  // namespace ingot::recipes
