// A run's training checkpoints, whichever kind its parallelism writes, behind save() and resume():
//   plain       one process or DDP: rank 0 writes the model, optimizer state and f32 masters (train_state.h);
//   ZeRO-1      every rank takes part in gathering the optimizer shards and masters onto rank 0, which writes a
//               plain checkpoint (Note [ZeRO-1 checkpoints hold the full optimizer state], data_parallel.cpp);
//   ZeRO-2/3    every rank writes its own slices (recipes/sharded_checkpoint.h).
// A ZeRO-1/2/3 run resumes from a plain checkpoint through a stand-in optimizer over the whole parameters, read
// before the data-parallel wrap cuts the shards; ZeRO-2/3 read only their slices of a sharded one. So resuming
// has a part before the wrap (read_before_wrap) and one once the optimizer exists (resume).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "recipes/run_settings.h"
#include "recipes/sharded_checkpoint.h"
#include "recipes/train_loop.h"
#include "recipes/train_state.h"

namespace ingot::recipes {

class DataParallel;

class CheckpointIO {
 public:
  // `dp` is null without data parallelism; rank 0 (or the only process) logs to `log`. `masters`: a 16-bit run
  // keeps f32 master weights (train.master_weights).
  CheckpointIO(const RunSettings& run, TrainTask& task, DataParallel* dp, const optim::OptimizerSpec& spec,
               bool masters, std::ostream& log);

  // Before dp->wrap, on resume: what can only be read while the parameters are whole. Nothing otherwise.
  void read_before_wrap();
  // The optimizer (and the masters of a bf16/f16 run, else null) that save() writes and resume() fills.
  void attach(optim::Optimizer& opt, optim::MasterWeights* masters);
  // Loads run.resume_checkpoint into the model, optimizer and masters and returns its train state; a fresh run
  // gets a TrainState at step 0. The caller restores RNG, loss scale and data position from it.
  TrainState resume();
  // Writes the checkpoint of `state.step` (collective under data parallelism), then removes checkpoints that do
  // not belong to this run (see remove_stale) and those beyond run.keep_last, waits for every rank (a restarted
  // job resumes from it) and logs its path. Returns the path.
  std::string save(const TrainState& state);
  // Checkpoints past this run's starting point belong to an earlier run in the same output_dir or to a future a
  // resume from an older step replaced. They go once, when this run has a checkpoint of its own (`own`, kept) or
  // writes its final artifacts without one (""); rank 0 removes them and names each in the log.
  void remove_stale(const std::string& own);

 private:
  std::string write(const TrainState& state);
  std::string write_zero1(const TrainState& state);

  const RunSettings& run_;
  TrainTask& task_;
  DataParallel* dp_;
  optim::OptimizerSpec spec_;
  std::ostream& log_;
  bool with_masters_ = false;
  bool is_main_ = true, sharded_ = false, stale_removed_ = false;
  optim::Optimizer* opt_ = nullptr;
  optim::MasterWeights* masters_ = nullptr;
  int64_t start_step_ = 0;
  // read_before_wrap's results, consumed by resume().
  TrainState read_state_;
  std::optional<ShardedCheckpoint> shards_;
  std::map<std::string, Tensor> full_opt_state_;
  std::vector<Tensor> full_masters_;
};

}  // namespace ingot::recipes
