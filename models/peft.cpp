#include "models/peft.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "models/hf_checkpoint.h"
#include "runtime/file_util.h"
#include "runtime/safetensors.h"

namespace ingot::models {
namespace {

using nlohmann::json;
constexpr const char* kPrefix = "base_model.model.";

void write_text(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, text.data(), text.size()); });
}

}  // namespace

void save_lora_adapter(const CausalLM& model, const nn::LoRAConfig& cfg, const HFConfig& base,
                       const std::string& dir, const std::string& base_model_name_or_path) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, t] : nn::lora_state_dict(model)) tensors.emplace_back(kPrefix + name, t);
  INGOT_CHECK(!tensors.empty(), "save_lora_adapter: the model has no LoRA adapters (call apply_lora first)");
  json c = {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"r", cfg.rank},
            {"lora_alpha", cfg.alpha},
            {"lora_dropout", cfg.dropout},
            {"target_modules", cfg.target_modules},
            {"bias", "none"},
            // GPT-2's Conv1D stores [in, out]; peft transposes the update for it when this is set.
            {"fan_in_fan_out", base.arch == HFConfig::Arch::GPT2},
            {"inference_mode", true},
            {"init_lora_weights", true},
            {"use_rslora", false},
            {"use_dora", false},
            {"modules_to_save", nullptr},
            {"base_model_name_or_path", base_model_name_or_path.empty() ? json(nullptr) : json(base_model_name_or_path)}};
  write_dir_atomic(dir, [&](const std::string& tmp) {
    save_safetensors(tmp + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
    write_text(tmp + "/adapter_config.json", c.dump(2) + "\n");
  });
}

namespace {

// adapter_config.json -> LoRAConfig; unsupported peft options are errors naming the key.
nn::LoRAConfig parse_adapter_config(const std::string& cpath) {
  json j;
  try {
    j = json::parse(read_file(cpath));
  } catch (const json::parse_error& e) {
    INGOT_CHECK(false, cpath, ": not valid JSON: ", e.what());
  }
  INGOT_CHECK(j.is_object(), cpath, ": expected a JSON object");
  auto key = [&](const char* k) { return cpath + ": key '" + k + "'"; };
  auto is_set = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  INGOT_CHECK(j.value("peft_type", std::string("LORA")) == "LORA", key("peft_type"), ": '", j["peft_type"].dump(),
              "' is not supported (LORA only)");
  for (const char* k : {"use_rslora", "use_dora"})
    INGOT_CHECK(!is_set(k) || j[k] == false, key(k), ": ", j[k].dump(), " is not supported");
  INGOT_CHECK(!is_set("bias") || j["bias"] == "none", key("bias"), ": ", j["bias"].dump(),
              " is not supported (only \"none\")");
  INGOT_CHECK(!is_set("modules_to_save") || j["modules_to_save"].empty(), key("modules_to_save"),
              ": fully trained extra modules are not supported");
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    INGOT_CHECK(!is_set(k) || j[k].empty(), key(k), ": per-module ranks are not supported");
  nn::LoRAConfig cfg;
  INGOT_CHECK(is_set("r") && j["r"].is_number_integer(), key("r"), ": expected an integer rank");
  cfg.rank = j["r"].get<int64_t>();
  INGOT_CHECK(is_set("lora_alpha") && j["lora_alpha"].is_number(), key("lora_alpha"), ": expected a number");
  cfg.alpha = j["lora_alpha"].get<double>();
  if (is_set("lora_dropout")) cfg.dropout = j["lora_dropout"].get<double>();
  INGOT_CHECK(is_set("target_modules") && j["target_modules"].is_array(), key("target_modules"),
              ": expected a list of module names (a regex string is not supported)");
  cfg.target_modules = j["target_modules"].get<std::vector<std::string>>();
  return cfg;
}

}  // namespace

nn::LoRAConfig load_lora_adapter(CausalLM& model, const std::string& dir) {
  const std::string cpath = dir + "/adapter_config.json", wpath = dir + "/adapter_model.safetensors";
  INGOT_CHECK(std::filesystem::exists(cpath), "no adapter_config.json in ", dir);
  INGOT_CHECK(std::filesystem::exists(wpath), "no adapter_model.safetensors in ", dir,
              " (only safetensors adapters are supported)");
  nn::LoRAConfig cfg;
  try {
    cfg = parse_adapter_config(cpath);
  } catch (const json::exception& e) {  // a value of the wrong JSON type
    INGOT_CHECK(false, cpath, ": ", e.what());
  }

  SafetensorsFile f = SafetensorsFile::open(wpath);
  // The config and tensor names are checked before the model is adapted; a shape mismatch found after leaves
  // it adapted, so callers load adapters into a freshly loaded model.
  std::set<std::string> in_file;
  for (const std::string& n : f.names()) {
    INGOT_CHECK(n.rfind(kPrefix, 0) == 0, wpath, ": tensor '", n, "' does not start with ", kPrefix);
    std::string ours = n.substr(std::string(kPrefix).size());
    // Some peft versions keep the adapter name ("lora_A.default.weight").
    for (const char* ab : {".lora_A.default.", ".lora_B.default."}) {
      auto pos = ours.find(ab);
      if (pos != std::string::npos) ours.replace(pos, std::string(ab).size(), std::string(ab).substr(0, 8));
    }
    in_file.insert(ours);
  }
  nn::apply_lora(model, cfg);
  std::vector<std::string> missing;
  NoGradGuard ng;
  for (auto& [name, p] : nn::lora_state_dict(model)) {
    std::string key_name = kPrefix + name;
    if (!f.has(key_name)) {
      const std::string alt = std::string(kPrefix) + name.substr(0, name.size() - 7) + ".default.weight";
      if (f.has(alt)) key_name = alt;
    }
    if (!f.has(key_name)) {
      missing.push_back(name);
      continue;
    }
    in_file.erase(name);
    const TensorInfo& info = f.info(key_name);
    INGOT_CHECK(info.shape == p.shape(), wpath, ": tensor '", key_name, "' has shape ", shape_str(info.shape),
                ", expected ", shape_str(p.shape()), " (r=", cfg.rank, ")");
    INGOT_CHECK(is_floating(info.dtype), wpath, ": tensor '", key_name, "' has dtype ", dtype_name(info.dtype));
    Tensor dst = p;
    dst.copy_(f.get(key_name));
  }
  INGOT_CHECK(missing.empty(), wpath, ": missing adapter tensors (", missing.size(), "), first ", missing.front());
  INGOT_CHECK(in_file.empty(), wpath, ": tensors for modules this model does not adapt, first ",
              *in_file.begin());
  return cfg;
}

}  // namespace ingot::models
