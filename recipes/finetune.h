// The fine-tuning recipes: a Hugging Face checkpoint (models/hf_checkpoint.h) trained further on text or
// instruction data with the shared training loop (recipes/train_loop.h), then exported in Hugging Face layout.
//
//   full_finetune   every parameter is trained; output_dir/hf/ is the new checkpoint
//   lora_finetune   LoRA adapters on lora.target_modules are trained, the base weights stay frozen (bitwise);
//                   output_dir/adapter/ is a PEFT adapter, and with lora.merge_on_export output_dir/hf/ is the
//                   base with the adapters merged in
//
// The run directory (output_dir) receives:
//   hf/                   config.json, model.safetensors (or shards + index above export.max_shard_mb),
//                         generation_config.json and the tokenizer files: loadable by transformers and ingot
//   adapter/              adapter_config.json + adapter_model.safetensors (lora_finetune)
//   config.yaml, summary.json, metrics.jsonl, loss.png, checkpoints/step_N/  as pretrain writes them
// Every export is written under a temporary name and renamed into place (all or nothing).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "autograd/nn/lora.h"
#include "recipes/config.h"
#include "recipes/lm_inputs.h"
#include "recipes/run_settings.h"
#include "recipes/train_loop.h"

namespace ingot::recipes {

const ConfigSchema& full_finetune_schema();
const ConfigSchema& lora_finetune_schema();

struct FinetuneSettings {
  bool lora = false;  // recipe lora_finetune
  RunSettings run;
  ModelSource model;
  DataSettings data;
  TrainOptions train;
  int64_t epochs = 0;  // > 0: the run lasts this many passes over the data (max_steps is not used)
  nn::LoRAConfig lora_config;
  bool merge_on_export = false;  // lora.merge_on_export (LoRA only: a full fine-tune always exports the model)
  bool quantize_base_nf4 = false;  // lora.quantize_base: nf4 (models/qlora.h)
  int64_t max_shard_bytes = 0;
  // As PretrainSettings::halt_after_steps: stop after this many steps as if the process died (tests).
  int64_t halt_after_steps = 0;
};

// Checks what the schema cannot: model.path holds a Hugging Face checkpoint, the tokenizer and data files
// exist, data.seq_len fits the model, every lora.target_modules entry names a projection of the model's
// architecture, resuming is consistent. Errors go to `errors`; the one-argument form throws them as one.
FinetuneSettings resolve_finetune(const Config& cfg, ConfigErrors& errors);
FinetuneSettings resolve_finetune(const Config& cfg);

// Loads the tokenizer, data and checkpoint (any error there leaves output_dir untouched), trains, exports.
TrainSummary run_finetune(const FinetuneSettings& s, std::ostream& log);

// The projections LoRA can adapt in a model of this architecture (Module names from models/decoder.cpp).
std::vector<std::string> lora_target_names(const models::HFConfig& cfg);

}  // namespace ingot::recipes
