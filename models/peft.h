// LoRA adapters in PEFT's format, so transformers + peft can load what ingot trained (and the reverse):
// dir/adapter_config.json and dir/adapter_model.safetensors with keys "base_model.model.<our name>"
// (e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight).
#pragma once

#include <string>

#include "autograd/nn/lora.h"
#include "models/hf_config.h"

namespace ingot::models {

// Writes only the adapter tensors (atomically, as a directory). base_model_name_or_path is recorded for peft.
void save_lora_adapter(const CausalLM& model, const nn::LoRAConfig& cfg, const HFConfig& base,
                       const std::string& dir, const std::string& base_model_name_or_path = "");

// Reads dir/adapter_config.json, adds the adapters to `model` (apply_lora) and loads their weights; every
// adapter tensor must be present with its shape. PEFT options ingot does not implement (use_rslora, use_dora,
// bias other than "none", modules_to_save, rank/alpha patterns) are errors naming the key.
nn::LoRAConfig load_lora_adapter(CausalLM& model, const std::string& dir);

}  // namespace ingot::models
