#include "recipes/eval.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>

#include "models/hf_checkpoint.h"
#include "models/peft.h"
#include "recipes/eval_tasks.h"
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
    s.add(K::of(T::String, "eval.task", "perplexity",
                "perplexity of data.path; multiple_choice: accuracy on JSONL {question, choices, answer} lines; "
                "exact_match: greedy completions of JSONL {prompt, answer} lines against the answers")
              .one_of({"perplexity", "multiple_choice", "exact_match"}));
    s.add(K::of(T::Int, "eval.max_new_tokens", "32", "exact_match: tokens generated per prompt").at_least(1));
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
  const ConfigReader rd(cfg, errors);
  s.dtype = parse_dtype(rd.str("dtype"));
  s.batch_size = rd.i64("eval.batch_size");
  s.max_batches = rd.i64("eval.max_batches");
  s.task = rd.str("eval.task");
  s.max_new_tokens = rd.i64("eval.max_new_tokens");
  // The task's file is read now, so that `ingot validate` names a malformed line.
  if (s.task != "perplexity" && !errors.has_error_for("data.path") && !errors.has_error_for("eval.task")) {
    try {
      if (s.task == "multiple_choice") read_choice_items(s.data.path);
      else read_match_items(s.data.path);
    } catch (const ConfigError& e) {
      errors.fail(cfg, "data.path", std::string(e.what()) + " (eval.task: " + s.task + ")");
    }
  }
  return s;
}

EvalSettings resolve_eval(const Config& cfg) {
  ConfigErrors errors;
  EvalSettings s = resolve_eval(cfg, errors);
  errors.raise_if_any();
  return s;
}

namespace {

EvalResult run_task(const EvalSettings& s, std::ostream& log) {
  auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tok = load_tokenizer(s.model);
  models::HFModel hf = models::load_hf_model(s.model.path, s.dtype);
  if (!s.model.adapter.empty()) models::load_lora_adapter(*hf.model, s.model.adapter);
  hf.model->to(s.device);
  EvalResult r;
  r.task = s.task;
  char buf[256];
  if (s.task == "multiple_choice") {
    const ChoiceScore c = score_choices(*hf.model, tok, read_choice_items(s.data.path), s.device);
    r.accuracy = c.accuracy;
    r.accuracy_norm = c.accuracy_norm;
    r.items = c.questions;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::snprintf(buf, sizeof buf, "eval | multiple_choice | accuracy %.3f (acc_norm %.3f) | %lld questions | %s\n",
                  r.accuracy, r.accuracy_norm, static_cast<long long>(r.items), format_duration(r.seconds).c_str());
  } else {
    std::vector<int64_t> eos(s.model.config.eos_token_ids.begin(), s.model.config.eos_token_ids.end());
    if (tok.eos_id()) eos.push_back(*tok.eos_id());
    const MatchScore m =
        score_exact_match(*hf.model, tok, read_match_items(s.data.path), s.device, s.max_new_tokens, eos);
    r.exact_match = m.exact_match;
    r.items = m.prompts;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::snprintf(buf, sizeof buf, "eval | exact_match | %.3f | %lld prompts (greedy, up to %lld new tokens) | %s\n",
                  r.exact_match, static_cast<long long>(r.items), static_cast<long long>(s.max_new_tokens),
                  format_duration(r.seconds).c_str());
  }
  r.model = s.model.path;
  r.adapter = s.model.adapter;
  r.data = s.data.path;
  r.device = s.device.str();
  r.dtype = std::string(dtype_name(s.dtype));
  log << s.model.path << (s.model.adapter.empty() ? "" : " + " + s.model.adapter) << " on " << s.data.path << "\n"
      << buf << std::flush;
  return r;
}

}  // namespace

EvalResult run_eval(const EvalSettings& s, std::ostream& log) {
  if (s.task != "perplexity") return run_task(s, log);
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
  j["task"] = r.task;
  if (r.task == "perplexity") {
    j["loss"] = r.loss;
    j["perplexity"] = r.perplexity;
    j["tokens"] = r.tokens;
    j["rows"] = r.rows;
  } else if (r.task == "multiple_choice") {
    j["accuracy"] = r.accuracy;
    j["accuracy_norm"] = r.accuracy_norm;
    j["questions"] = r.items;
  } else {
    j["exact_match"] = r.exact_match;
    j["prompts"] = r.items;
  }
  j["seconds"] = r.seconds;
  j["model"] = r.model;
  j["adapter"] = r.adapter;
  j["data"] = r.data;
  j["device"] = r.device;
  j["dtype"] = r.dtype;
  return j.dump(2) + "\n";
}

}  // namespace ingot::recipes
