// Hugging Face config.json <-> model configs.
//
// Supported model_type values: "gpt2" (GPT2LMHeadModel) and the Llama family, "llama" (Llama 2/3/3.x, SmolLM),
// "mistral" and "qwen2" (Qwen2/2.5). Defaults for absent keys are transformers' defaults for that model type.
// Anything the models cannot reproduce exactly (another activation, an unknown rope_type, sliding-window layers,
// cross attention...) is an error naming the file and the key, never a silently different model.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "models/llama.h"
#include "runtime/dtype.h"

namespace ingot::models {

struct HFConfig {
  enum class Arch { GPT2, Llama };
  std::string model_type;  // "gpt2", "llama", "mistral", "qwen2"
  Arch arch = Arch::Llama;
  GPT2Config gpt2;    // when arch == GPT2
  LlamaConfig llama;  // when arch == Llama
  std::optional<int64_t> bos_token_id, pad_token_id;
  std::vector<int64_t> eos_token_ids;  // config.json's eos_token_id (an int or a list)
  std::string torch_dtype;             // as written ("float32", "bfloat16"), empty when absent
  std::string source = "config.json";  // where it came from, for error messages
  std::string json;                    // the original text, so an export keeps every key transformers wrote

  int64_t vocab_size() const { return arch == Arch::GPT2 ? gpt2.vocab_size : llama.vocab_size; }
  bool tie_word_embeddings() const {
    return arch == Arch::GPT2 ? gpt2.tie_word_embeddings : llama.tie_word_embeddings;
  }
};

// Parses config.json text; `source` names it in errors.
HFConfig parse_hf_config(const std::string& json_text, const std::string& source = "config.json");
// `path` is a config.json file or a directory holding one.
HFConfig load_hf_config(const std::string& path);

// A fresh (randomly initialized, f32, CPU) model of the configured architecture.
std::shared_ptr<CausalLM> make_causal_lm(const HFConfig& cfg);

// The HFConfig describing a model built in ingot (for exporting a model that did not come from a checkpoint).
HFConfig hf_config_for(const GPT2Config& cfg);
HFConfig hf_config_for(const LlamaConfig& cfg);
// Of a GPT2 or Llama; an error for any other CausalLM.
HFConfig hf_config_for(const CausalLM& model);

// config.json text for `cfg` with torch_dtype set to `dtype`: the original keys when cfg came from a file,
// otherwise the keys transformers needs to rebuild the same model.
std::string hf_config_json(const HFConfig& cfg, DType dtype);

// transformers' name for a dtype ("float32", "bfloat16", "float16"); an error for others.
std::string hf_dtype_name(DType dtype);

}  // namespace ingot::models
