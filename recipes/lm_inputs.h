// What the recipes that start from a Hugging Face checkpoint share (full_finetune, lora_finetune, eval,
// generate): the model.* / tokenizer.* / data.* config sections, their checks, and loading them.
//
//   model.path      a checkpoint directory: config.json + model.safetensors (or shards and their index)
//   model.adapter   a PEFT adapter directory applied on top (eval and generate)
//   tokenizer.path  a directory with tokenizer.json (or vocab.json + merges.txt); default: model.path
//   data.format     text | jsonl | instruction (alpaca fields) | chat (messages lists)
//   data.path, data.seq_len, data.packing, data.shuffle, data.chat_template, data.text_field, data.val_fraction
//
// Checks of files happen when the config is validated, so `ingot validate` reports them with the key's
// file:line:col: config.json, the data file (present, non-empty, UTF-8), the tokenizer (it loads and fits the
// model) and the chat template data.chat_template names or detects. Tokenizing the data happens when the recipe
// runs; a bad JSONL line is then an ingot::Error naming the file and line, before anything is written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/causal_lm.h"
#include "models/hf_config.h"
#include "recipes/config.h"
#include "recipes/datasets/loader.h"
#include "recipes/datasets/sources.h"
#include "recipes/tokenizer/tokenizer.h"
#include "runtime/device.h"

namespace ingot::recipes {

// model.path (required), tokenizer.path and, with `adapter`, model.adapter.
void add_model_keys(ConfigSchema& s, bool adapter);
// data.*; `training` adds data.packing, data.shuffle and data.val_fraction (eval reads every row, unpacked, in order).
void add_data_keys(ConfigSchema& s, bool training, const std::string& default_format);

struct ModelSource {
  std::string path, adapter, tokenizer_path;
  models::HFConfig config;  // model.path/config.json, parsed
};

// Checks that model.path holds a readable config.json (and weights), tokenizer.path a tokenizer, and
// model.adapter an adapter_config.json.
ModelSource resolve_model_source(const Config& cfg, ConfigErrors& errors);

struct DataSettings {
  std::string format;         // text | jsonl | instruction | chat | token_rows
  std::string path;
  int64_t seq_len = 0;        // tokens per row (inputs); at most the model's positions
  int64_t vocab_size = 0;     // the model's: token_rows ids stay below it
  bool packing = true;
  bool shuffle = true;        // a new row order every epoch (seeded); false: file order
  std::string chat_template;  // auto | llama3 | chatml | qwen3 | alpaca
  std::string text_field;
  double val_fraction = 0;    // trailing fraction of the examples held out for validation
};

// seq_len 0 becomes the model's position limit (at most 2048); a larger seq_len is an error.
DataSettings resolve_data(const Config& cfg, const models::HFConfig& model, ConfigErrors& errors);

// The tokenizer of tokenizer.path. Its vocabulary must fit the model's embedding (an error naming both).
Tokenizer load_tokenizer(const ModelSource& src);

// What a run would find when it loads the tokenizer and renders the data: the data file's text problems
// (data.path), a tokenizer that does not load or fit (tokenizer.path, or model.path when it holds the
// tokenizer), and, for instruction and chat data, a chat template that cannot be used (data.chat_template).
void check_tokenizer_and_data(const Config& cfg, const ModelSource& src, const DataSettings& d,
                              ConfigErrors& errors);
// The same for a chat template read from `key` ("none" skips it): the tokenizer loads and the template fits it.
void check_chat_template(const Config& cfg, const ModelSource& src, const std::string& key, const std::string& name,
                         ConfigErrors& errors);

// Every example of data.path, tokenized, with prompt tokens labelled kIgnoreIndex. Errors name the file
// (and line); an empty data set is an error too.
std::vector<datasets::Example> load_data(const DataSettings& d, const Tokenizer& tok);

// The chat template data.chat_template names, or the tokenizer's own (auto).
ChatTemplate chat_template_for(const std::string& name, const Tokenizer& tok);

// Next-token loss summed over every row of `examples`: one example per row (up to seq_len + 1 tokens,
// right-padded, so causal attention never sees the padding), in file order, batches of `batch_size` with the
// last partial batch included; at most `max_batches` batches when > 0. Runs without gradients.
struct LossSum {
  double total_nll = 0;  // summed over loss tokens
  int64_t tokens = 0;    // loss tokens (labels other than kIgnoreIndex)
  int64_t rows = 0;
  double mean() const { return tokens > 0 ? total_nll / static_cast<double>(tokens) : 0.0; }
};
// With world > 1, only the batches whose index is rank modulo world (the ranks of a data-parallel job split
// the evaluation; summing their LossSums gives the whole one).
LossSum sum_loss(models::CausalLM& model, const std::vector<datasets::Example>& examples, int64_t seq_len,
                 int64_t batch_size, int64_t max_batches, Device device, int rank = 0, int world = 1);

}  // namespace ingot::recipes
