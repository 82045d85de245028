// The eval recipe: the perplexity of a Hugging Face checkpoint (optionally with a PEFT adapter) on a data
// file. Every example is one row (truncated to data.seq_len + 1 tokens); prompt tokens of instruction and chat
// data are not scored, as in training. Perplexity = exp(mean next-token cross entropy over scored tokens).
// eval.task: multiple_choice scores accuracy on a multiple-choice JSONL file, exact_match greedy generations
// against answers (recipes/eval_tasks.h).
//
//   eval | loss 2.345 | perplexity 10.43 | 4.1k tokens in 32 rows | 0.2 s
//   eval | multiple_choice | accuracy 0.625 (acc_norm 0.750) | 8 questions | 0.4 s
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
  std::string task = "perplexity";           // eval.task: perplexity, multiple_choice or exact_match
  int64_t max_new_tokens = 32;               // eval.max_new_tokens (exact_match)
  std::string config_file;
};

EvalSettings resolve_eval(const Config& cfg, ConfigErrors& errors);
EvalSettings resolve_eval(const Config& cfg);

struct EvalResult {
  std::string task = "perplexity";
  double loss = 0, perplexity = 0;
  int64_t tokens = 0, rows = 0;
  double accuracy = 0, accuracy_norm = 0;  // multiple_choice
  double exact_match = 0;                  // exact_match
  int64_t items = 0;                       // questions or prompts scored
  double seconds = 0;
  std::string model, adapter, data, device, dtype;
};

EvalResult run_eval(const EvalSettings& s, std::ostream& log);
std::string eval_json(const EvalResult& r);

}  // namespace ingot::recipes
