#include "recipes/eval.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>

#include "models/hf_checkpoint.h"
#include "models/peft.h"
#include "recipes/metrics.h"
#include "recipes/run_settings.h"

namespace ingot::recipes {

const ConfigSchema& eval_schema() {
  static const ConfigSchema schema = [] {
    using T = ConfigType;
    using K = ConfigKey;
    ConfigSchema s;
    s.add(K::of(T::String, "recipe", "eval", "the recipe this config runs (`ingot ls` lists them)"));
    add_device_keys(s);
    add_model_keys(s, /*adapter=*/true);
    add_data_keys(s, /*training=*/false, "text");
    s.add(K::of(T::Int, "eval.batch_size", "8", "rows per forward pass").at_least(1));
    s.add(K::of(T::Int, "eval.max_batches", "0", "stop after this many batches (0: the whole file)").at_least(0));
    return s;
  }();
  return schema;
}

EvalSettings resolve_eval(const Config& cfg, ConfigErrors& errors) {
  EvalSettings s;
  s.config_file = cfg.file();
  s.device = resolve_device(cfg, errors);
  s.model = resolve_model_source(cfg, errors);
  s.data = resolve_data(cfg, s.model.config, errors);
  check_tokenizer_and_data(cfg, s.model, s.data, errors);
  try {
    s.dtype = cfg.get_string("dtype") == "bf16" ? DType::bf16 : DType::f32;
    s.batch_size = cfg.get_int("eval.batch_size");
    s.max_batches = cfg.get_int("eval.max_batches");
  } catch (const ConfigError&) {
    // Reported by the schema check.
  }
  return s;
}

EvalSettings resolve_eval(const Config& cfg) {
  ConfigErrors errors;
  EvalSettings s = resolve_eval(cfg, errors);
  errors.raise_if_any();
  return s;
}

EvalResult run_eval(const EvalSettings& s, std::ostream& log) {
  auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tok = load_tokenizer(s.model);
  std::vector<datasets::Example> examples = load_data(s.data, tok);
  models::HFModel hf = models::load_hf_model(s.model.path, s.dtype);
  if (!s.model.adapter.empty()) models::load_lora_adapter(*hf.model, s.model.adapter);
  hf.model->to(s.device);
  LossSum sum = sum_loss(*hf.model, examples, s.data.seq_len, s.batch_size, s.max_batches, s.device);
  INGOT_CHECK(sum.tokens > 0, s.data.path, ": no token is scored (every label is masked)");

  EvalResult r;
  r.loss = sum.mean();
  r.perplexity = std::exp(r.loss);
  r.tokens = sum.tokens;
  r.rows = sum.rows;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.model = s.model.path;
  r.adapter = s.model.adapter;
  r.data = s.data.path;
  r.device = s.device.str();
  r.dtype = std::string(dtype_name(s.dtype));
  char buf[256];
  std::snprintf(buf, sizeof buf, "eval | loss %.4f | perplexity %.3f | %s tokens in %lld rows | %s\n", r.loss,
                r.perplexity, format_count(static_cast<double>(r.tokens)).c_str(), static_cast<long long>(r.rows),
                format_duration(r.seconds).c_str());
  log << s.model.path << (s.model.adapter.empty() ? "" : " + " + s.model.adapter) << " on " << s.data.path << "\n"
      << buf << std::flush;
  return r;
}

std::string eval_json(const EvalResult& r) {
  nlohmann::ordered_json j;
  j["loss"] = r.loss;
  j["perplexity"] = r.perplexity;
  j["tokens"] = r.tokens;
  j["rows"] = r.rows;
  j["seconds"] = r.seconds;
  j["model"] = r.model;
  j["adapter"] = r.adapter;
  j["data"] = r.data;
  j["device"] = r.device;
  j["dtype"] = r.dtype;
  return j.dump(2) + "\n";
}

}  // namespace ingot::recipes
