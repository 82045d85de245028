// The eval recipe: the perplexity of a Hugging Face checkpoint (optionally with a PEFT adapter) on a data
// file. Every example is one row (truncated to data.seq_len + 1 tokens); prompt tokens of instruction and chat
// data are not scored, as in training. Perplexity = exp(mean next-token cross entropy over scored tokens).
//
//   eval | loss 2.345 | perplexity 10.43 | 4.1k tokens in 32 rows | 0.2 s
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "recipes/config.h"
#include "recipes/lm_inputs.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace ingot::recipes {

const ConfigSchema& eval_schema();

struct EvalSettings {
  Device device;
  DType dtype = DType::f32;
  ModelSource model;
  DataSettings data;
  int64_t batch_size = 8, max_batches = 0;  // 0: every row
  std::string config_file;
};

EvalSettings resolve_eval(const Config& cfg, ConfigErrors& errors);
EvalSettings resolve_eval(const Config& cfg);

struct EvalResult {
  double loss = 0, perplexity = 0;
  int64_t tokens = 0, rows = 0;
  double seconds = 0;
  std::string model, adapter, data, device, dtype;
};

EvalResult run_eval(const EvalSettings& s, std::ostream& log);
std::string eval_json(const EvalResult& r);

}  // namespace ingot::recipes
