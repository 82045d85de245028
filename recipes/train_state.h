// What a training loop saves to resume exactly, on top of recipes/checkpoint.h's atomic directories:
// the model (model.safetensors), the optimizer state plus f32 master weights in mixed precision
// (optimizer.safetensors), and the scalars of the loop (state.json): step, data position, LR schedule,
// RNG generator states, loss history figures and the hash of the config entries that change the math.
//
// Resuming restores all of them, so the next step computes exactly what the uninterrupted run would have
// (bitwise on CPU: same weights, same Adam moments, same batch, same dropout counters, same lr).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "autograd/nn/module.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "recipes/config.h"

namespace ingot::recipes {

struct GeneratorState {
  std::string device;  // "cpu", "cuda:0"
  uint64_t seed = 0, offset = 0;
};

struct TrainState {
  int64_t step = 0;              // completed optimizer steps
  int64_t sampler_position = 0;  // index of the next training batch
  int64_t tokens_seen = 0;
  // LR schedule position: the schedule is a pure function of the step, these record what it was built with.
  std::string lr_schedule;
  double base_lr = 0, min_lr = 0, last_lr = 0;
  int64_t warmup_steps = 0, total_steps = 0;
  std::vector<GeneratorState> rng;
  double first_loss = 0, best_loss = 0, last_loss = 0;
  double train_s = 0;  // training time before this checkpoint (so a resumed run's totals add up)
  // fp16 runs: the dynamic loss scale and its growth tracker (optim/loss_scaler.h); scale 0 in other runs.
  double loss_scale = 0;
  int64_t loss_scale_growth_tracker = 0;
  std::string config_hash;
  std::map<std::string, std::string> config;  // the hashed entries, to name what changed on a mismatch
};

// The config entries that determine the numbers a run computes: everything except where it writes, how
// often it logs or saves, how long it runs (max_steps only ends the run; the LR schedule length is recorded
// separately), and how it resumes: the keys the schema marks not_in_config_hash() are left out. `cfg` must be
// validated. Values are their canonical text; lists are "[a, b]".
std::map<std::string, std::string> training_config_entries(const Config& cfg);
std::string config_hash(const std::map<std::string, std::string>& entries);

// Snapshot / restore of every device's default Philox generator (seed and offset).
std::vector<GeneratorState> capture_rng();
void restore_rng(const std::vector<GeneratorState>& states);

std::string train_state_json(const TrainState& s);
// Parses state.json text; `file` names it in errors.
TrainState parse_train_state(const std::string& json, const std::string& file);

// Writes a complete checkpoint for `state.step` under output_dir (see recipes/checkpoint.h) and returns its
// path. `masters` is null unless the run keeps f32 master weights.
std::string save_training_checkpoint(const std::string& output_dir, const nn::Module& model,
                                     const optim::Optimizer& opt, const optim::MasterWeights* masters,
                                     const TrainState& state);

// Verifies the checkpoint's manifest and checksums, then loads the model, optimizer and masters in place and
// returns the loop state. Throws ingot::Error naming the checkpoint file that is missing or does not match.
TrainState load_training_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& opt,
                                    optim::MasterWeights* masters);

// Sharded checkpoints (recipes/sharded_checkpoint.h) load through load_training_checkpoint too (every tensor
// assembled whole). Resuming ZeRO-2/3 loads them shard-wise instead: this reads state.json and the model's
// entries other than `trained` (buffers, frozen weights) and, with load_trained, the trained weights whole;
// the shards of the rest come from DataParallel::load_shards.
class ShardedCheckpoint;
TrainState load_sharded_model_state(const ShardedCheckpoint& c, nn::Module& model, const std::vector<Tensor>& trained,
                                    bool load_trained);

// Throws ConfigError when the checkpoint was made with different math-relevant config entries, listing each
// key with its value then and now (`cfg` gives the current values' origins).
void check_resume_config(const TrainState& saved, const Config& cfg, const std::string& checkpoint_dir);

}  // namespace ingot::recipes
