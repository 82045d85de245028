// The generate recipe: a prompt continued by a Hugging Face checkpoint (optionally with a PEFT adapter) with
// models/generate.h: greedy, or sampling with temperature / top-k / top-p, seeded, with a KV cache. With
// generate.chat_template the prompt is sent as a user message and the reply follows the assistant header.
// The completion goes to stdout (`ingot run`), the settings and speed to the log.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "models/generate.h"
#include "recipes/config.h"
#include "recipes/lm_inputs.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace ingot::recipes {

const ConfigSchema& generate_schema();

struct GenerateSettings {
  Device device;
  DType dtype = DType::f32;
  ModelSource model;
  std::string prompt;
  std::string chat_template;  // none | auto | llama3 | chatml | qwen3
  models::GenerateOptions options;
  bool skip_special_tokens = true;
};

GenerateSettings resolve_generate(const Config& cfg, ConfigErrors& errors);
GenerateSettings resolve_generate(const Config& cfg);

struct GenerateResult {
  std::string prompt;      // the text given to the model (after the chat template)
  std::string completion;  // the new tokens decoded
  std::vector<int32_t> prompt_ids, new_ids;
  bool stopped_at_eos = false;
  double seconds = 0, tokens_per_s = 0;
};

GenerateResult run_generate(const GenerateSettings& s, std::ostream& log);
std::string generate_json(const GenerateResult& r);

}  // namespace ingot::recipes
