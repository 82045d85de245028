// Run metrics: the live progress line, the JSONL metrics log in the run directory, and the model-FLOPs
// utilization (MFU) estimate.
//
// metrics.jsonl holds one JSON object per line, appended as the run goes:
//   {"kind":"train","step":12,"loss":2.31,"lr":0.003,"grad_norm":0.84,"tokens":12288,"tokens_per_s":10500,
//    "mfu":null,"peak_memory_bytes":1048576,"time_s":1.2}
//   {"kind":"eval","step":100,"val_loss":2.1}
// null marks what was not measured (mfu without a known device peak, grad_norm of a compiled step without
// clipping); peak_memory_bytes is the device allocator's high-water mark during the step. When a run fails,
// the steps after its last checkpoint move to metrics.failed.jsonl (no saved model holds them).
// Losses are written with round-trip precision, so two runs can be compared bitwise from their logs.
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace ingot::recipes {

struct MetricPoint {
  std::string kind;  // "train" or "eval"
  int64_t step = 0;
  double value = 0;  // loss (train) or val_loss (eval)
  double lr = std::numeric_limits<double>::quiet_NaN();  // train records' learning rate (NaN when not logged)
};

class MetricsLog {
 public:
  // Opens <path> for appending. With `keep_until_step` >= 0 (a resumed run), first rewrites the file
  // (atomically) keeping only records with step <= keep_until_step, so steps replayed after the checkpoint
  // are not logged twice. Throws ingot::Error naming the file.
  MetricsLog(const std::string& path, int64_t keep_until_step = -1);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  // Appends one line (a JSON object serialized by the caller's nlohmann::json dump) and flushes it.
  void append(const std::string& json_line);
  const std::string& path() const { return path_; }
  // Closes the log and moves the records with step > `step` to `moved_to` (replacing it); returns how many
  // moved. The log takes no more records afterwards.
  int64_t set_aside_after(int64_t step, const std::string& moved_to);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

// Reads the train losses (and learning rates) and eval losses of a metrics.jsonl (lines that do not parse are skipped and
// counted in *bad_lines when given). Throws when the file cannot be read.
std::vector<MetricPoint> read_metrics(const std::string& path, int64_t* bad_lines = nullptr);

// Training FLOPs per token that a decoder-only transformer runs (PaLM appendix B, frozen weights apart): 6 per
// trained weight (forward, input gradient and weight gradient products), 4 per frozen weight (no weight gradient:
// the base of a LoRA fine-tune runs ~4N, its adapters 6 each), plus 12 L T d for the attention scores. Neither
// count includes the embedding tables.
double transformer_flops_per_token(int64_t trained_params, int64_t frozen_params, int64_t n_layer, int64_t seq_len,
                                   int64_t d_model);
// The device's dense peak in FLOP/s used for MFU: `configured_tflops` when > 0, otherwise the H100/H200
// figure for CUDA (989 TFLOP/s bf16, 495 TFLOP/s tf32 for f32) and 0 (MFU not reported) for CPUs.
double peak_flops(bool cuda, bool bf16, double configured_tflops);

// "12.3k", "1.25M", "950"
std::string format_count(double n);
// "0:41", "1:02:03"
std::string format_duration(double seconds);
// "512.0 MiB", "1.25 GiB"
std::string format_bytes(double bytes);

// One progress line:
//   step 20/300 | loss 2.345 | lr 3.0e-04 | gnorm 0.84 | 12.3k tok/s | MFU 31.2% | mem peak 1.25 GiB | ETA 0:41
// The gradient norm is left out when grad_norm < 0, MFU when mfu < 0, memory when memory_bytes < 0; an
// eta_s < 0 (not known yet) prints as "ETA -".
std::string progress_line(int64_t step, int64_t total, double loss, double lr, double grad_norm, double tokens_per_s,
                          double mfu, double memory_bytes, double eta_s);

}  // namespace ingot::recipes
