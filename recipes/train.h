// The pretrain recipe: a GPT-2 trained from scratch on a text file (byte tokens), eager, with AdamW, a
// warm-up + decay LR schedule, gradient clipping, and optional bf16 mixed precision (fp32 master weights).
//
//   Config cfg = Config::load(path); cfg.apply_override(...); cfg.validate(pretrain_schema());
//   PretrainSettings s = resolve_pretrain(cfg);      // semantic checks, ConfigError naming the key
//   TrainSummary r = run_pretrain(s, std::cerr);      // progress lines go to the stream
//   write_summary(r, "summary.json");                 // atomic
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "recipes/config.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace ingot::recipes {

// Every key the pretrain recipe reads, with defaults and help (what `ingot run --help` prints).
const ConfigSchema& pretrain_schema();

// A validated config as typed values.
struct PretrainSettings {
  std::string config_file;
  std::string resolved_yaml;  // the config with defaults and overrides applied, saved beside the weights
  Device device;
  DType dtype = DType::f32;  // f32, or bf16 compute with f32 master weights
  int64_t max_steps = 0;
  uint64_t seed = 0;
  std::string output_dir;
  bool compile = false;
  std::string compile_mode;
  // model
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0;
  double dropout = 0;
  // data
  std::string data_path;
  double val_fraction = 0;
  // train
  int64_t batch_size = 0, warmup_steps = 0, log_every = 0, eval_batches = 0;
  double lr = 0, min_lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, grad_clip = 0;
  std::string lr_schedule;
};

// Checks what the schema cannot (device present, n_embd divisible by n_head, the data file exists, resume
// has a checkpoint, ...) and converts. Throws ConfigError naming the key and where it was set.
PretrainSettings resolve_pretrain(const Config& cfg);

struct TrainSummary {
  int64_t steps = 0;
  double first_loss = 0, final_loss = 0, best_loss = 0;  // training loss of step 1, the last step, the lowest
  double val_loss = 0;                                   // mean over train.eval_batches validation batches
  double tokens_per_s = 0, train_s = 0;                  // training steps only (no set-up, eval or saving)
  // Compiler figures; 0 while every run is eager.
  double compile_s = 0;
  int64_t graphs = 0, graph_breaks = 0, recompiles = 0;
  int64_t peak_memory_bytes = 0;  // the device allocator's high-water mark during the run
  int64_t num_parameters = 0;
  std::string device, dtype, output_dir, config_file;
  std::vector<std::string> checkpoints;  // files written under output_dir
};

// Trains, evaluates on the validation split, saves output_dir/{model.safetensors,config.yaml,summary.json}.
// Writes one progress line every log_every steps to `log`:
//   step 20/300 | loss 2.345 | lr 3.0e-04 | 12.3k tok/s | ETA 0:41
// (loss is the mean over the steps since the previous line). Throws ingot::Error on failures (a
// non-finite loss, unwritable output), leaving earlier files in output_dir untouched.
TrainSummary run_pretrain(const PretrainSettings& s, std::ostream& log);

// The summary as one JSON object, written atomically (an existing file is replaced only when complete).
std::string summary_json(const TrainSummary& r);
void write_summary(const TrainSummary& r, const std::string& path);

}  // namespace ingot::recipes
