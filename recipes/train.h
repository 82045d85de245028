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
#include <string>
#include <vector>

#include "recipes/config.h"
#include "recipes/run_settings.h"
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
  // train
  int64_t batch_size = 0, grad_accum = 1, warmup_steps = 0, log_every = 0, eval_every = 0, eval_batches = 0;
  double lr = 0, min_lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, grad_clip = 0;
  std::string lr_schedule;
  // Stops the loop after this many completed steps as if the process had died there (no final eval,
  // weights or summary; checkpoints already written stay). 0: off. Tests use it to check exact resume.
  int64_t halt_after_steps = 0;
};

// Checks what the schema cannot (device present, n_embd divisible by n_head, the data file exists, the
// checkpoint to resume from exists and was made with the same config, ...) and converts. Errors are recorded
// in `errors`; the one-argument form throws them all as one ConfigError.
PretrainSettings resolve_pretrain(const Config& cfg, ConfigErrors& errors);
PretrainSettings resolve_pretrain(const Config& cfg);

struct TrainSummary {
  int64_t steps = 0;
  double first_loss = 0, final_loss = 0, best_loss = 0;  // training loss of step 1, the last step, the lowest
  double val_loss = 0;                                   // mean over train.eval_batches validation batches
  double tokens_per_s = 0, train_s = 0;                  // training steps only (no set-up, eval or saving)
  double mfu = 0;                                        // model FLOPs utilization (0 when no peak is known)
  // Compiler figures; 0 while every run is eager.
  double compile_s = 0;
  int64_t graphs = 0, graph_breaks = 0, recompiles = 0;
  int64_t peak_memory_bytes = 0;  // the device allocator's high-water mark during the run
  int64_t num_parameters = 0;
  int64_t resumed_from_step = 0;  // 0 for a fresh run
  std::string device, dtype, output_dir, config_file, resumed_from;
  std::vector<std::string> checkpoints;           // final files written under output_dir
  std::vector<std::string> training_checkpoints;  // checkpoint directories kept at the end
  std::string metrics_log, loss_plot, tensorboard_dir, profile_trace;
};

// Trains, evaluates on the validation split, saves the run directory described above. Writes one progress
// line every log_every steps to `log` (loss is the mean over the steps since the previous line):
//   step 20/300 | loss 2.345 | lr 3.0e-04 | 12.3k tok/s | MFU 1.2% | mem 12.0 MiB | ETA 0:41
// Throws ingot::Error on failures (a non-finite loss, unwritable output, a corrupt checkpoint), leaving
// earlier files in output_dir untouched.
TrainSummary run_pretrain(const PretrainSettings& s, std::ostream& log);

// The summary as one JSON object, written atomically (an existing file is replaced only when complete).
std::string summary_json(const TrainSummary& r);
void write_summary(const TrainSummary& r, const std::string& path);

}  // namespace ingot::recipes
