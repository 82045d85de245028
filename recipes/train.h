// The pretrain recipe: a GPT-2 trained from scratch on a text file (byte tokens), eager, with AdamW, a
// warm-up + decay LR schedule, gradient clipping and accumulation, optional bf16 mixed precision (fp32 master
// weights), periodic training checkpoints and exact resume (recipes/train_state.h).
//
//   Config cfg = Config::load(path); cfg.apply_override(...); cfg.validate(pretrain_schema());
//   PretrainSettings s = resolve_pretrain(cfg);      // semantic checks, ConfigError naming the key
//   TrainSummary r = run_pretrain(s, std::cerr);      // progress lines go to the stream
//   write_summary(r, "summary.json");                 // atomic
//
// The run directory (output_dir) receives:
//   model.safetensors, config.yaml, summary.json     final f32 weights, resolved config, summary
//   metrics.jsonl                                    one record per step and per eval (recipes/metrics.h)
//   loss.png                                         the loss curve (logging.plot)
//   checkpoints/step_NNNNNNNN/                       training checkpoints (checkpoint.save_every)
//   tensorboard/events.out.tfevents.*                with logging.tensorboard
//   profile/trace.json, profile/top_ops.txt          with profile.enabled
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "recipes/config.h"
#include "recipes/run_settings.h"
#include "recipes/train_loop.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace ingot::recipes {

// Every key the pretrain recipe reads, with defaults and help (what `ingot run --help` prints).
const ConfigSchema& pretrain_schema();

// A validated config as typed values.
struct PretrainSettings {
  RunSettings run;
  // model
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0;
  double dropout = 0;
  // data
  std::string data_path;
  double val_fraction = 0;
  TrainOptions train;
  // Stops the loop after this many completed steps as if the process had died there (no final eval,
  // weights or summary; checkpoints already written stay). 0: off. Tests use it to check exact resume.
  int64_t halt_after_steps = 0;
};

// Checks what the schema cannot (device present, n_embd divisible by n_head, the data file exists, the
// checkpoint to resume from exists and was made with the same config, ...) and converts. Errors are recorded
// in `errors`; the one-argument form throws them all as one ConfigError.
PretrainSettings resolve_pretrain(const Config& cfg, ConfigErrors& errors);
PretrainSettings resolve_pretrain(const Config& cfg);

// The pretrain model: a GPT-2 of `s`'s sizes over `vocab_size` tokens on the run's device, its weights drawn
// from run.seed. ZeRO-3 with several ranks builds it without bytes (Note [Parameters without bytes],
// distributed/fsdp.h) unless a whole (not sharded) checkpoint is to be resumed into it; `initial_values` then
// draws any slice of the weights a one-process run draws, bit for bit (Note [Initial values drawn later],
// autograd/nn/layers.h), and the training loop fills each rank's shards with it after wrapping (one unit whole at
// a time), so no rank ever holds the whole model.
struct PretrainModel {
  std::shared_ptr<models::GPT2> model;
  std::optional<TrainTask::WeightSlices> initial_values;
};
PretrainModel build_pretrain_model(const PretrainSettings& s, int64_t vocab_size);

// Trains (recipes/train_loop.h), evaluates on the validation split, saves the run directory described above.
// Throws ingot::Error on failures (a non-finite loss, unwritable output, a corrupt checkpoint), leaving
// earlier files in output_dir untouched.
TrainSummary run_pretrain(const PretrainSettings& s, std::ostream& log);

}  // namespace ingot::recipes
