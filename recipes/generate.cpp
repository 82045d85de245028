#include "recipes/generate.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ostream>

#include "models/hf_checkpoint.h"
#include "models/peft.h"
#include "recipes/run_settings.h"

namespace ingot::recipes {

const ConfigSchema& generate_schema() {
  static const ConfigSchema schema = [] {
    using T = ConfigType;
    using K = ConfigKey;
    ConfigSchema s;
    s.add(K::of(T::String, "recipe", "generate", "the recipe this config runs (`ingot ls` lists them)"));
    add_device_keys(s);
    s.add(K::of(T::Int, "seed", "0", "seeds sampling").at_least(0));
    add_model_keys(s, /*adapter=*/true);
    s.add(K::required_key(T::String, "generate.prompt", "the text to continue"));
    s.add(K::of(T::String, "generate.chat_template", "none",
                "none: continue the text as is; otherwise send it as a user message in this template")
              .one_of({"none", "auto", "llama3", "chatml", "qwen3"}));
    s.add(K::of(T::Int, "generate.max_new_tokens", "32", "tokens to generate at most").at_least(1));
    s.add(K::of(T::Bool, "generate.do_sample", "false", "sample (true) or take the most likely token (false)"));
    s.add(K::of(T::Float, "generate.temperature", "1.0", "divides the logits before sampling").at_least(1e-6));
    s.add(K::of(T::Int, "generate.top_k", "0", "sample among the k most likely tokens (0: all)").at_least(0));
    s.add(K::of(T::Float, "generate.top_p", "1.0", "sample among the most likely tokens reaching this mass")
              .at_least(1e-6)
              .at_most(1));
    s.add(K::of(T::Bool, "generate.use_cache", "true", "reuse keys and values of earlier tokens (KV cache)"));
    s.add(K::of(T::Bool, "generate.skip_special_tokens", "true", "leave special tokens out of the printed text"));
    return s;
  }();
  return schema;
}

GenerateSettings resolve_generate(const Config& cfg, ConfigErrors& errors) {
  GenerateSettings s;
  s.device = resolve_device(cfg, errors);
  s.model = resolve_model_source(cfg, errors);
  const ConfigReader rd(cfg, errors);
  s.dtype = parse_dtype(rd.str("dtype"));
  s.prompt = rd.str("generate.prompt");
  s.chat_template = rd.str("generate.chat_template");
  s.options.max_new_tokens = rd.i64("generate.max_new_tokens");
  s.options.do_sample = rd.flag("generate.do_sample");
  s.options.temperature = rd.f64("generate.temperature");
  s.options.top_k = rd.i64("generate.top_k");
  s.options.top_p = rd.f64("generate.top_p");
  s.options.use_cache = rd.flag("generate.use_cache");
  s.options.seed = static_cast<uint64_t>(rd.i64("seed"));
  s.skip_special_tokens = rd.flag("generate.skip_special_tokens");
  if (cfg.has("generate.prompt") && !errors.has_error_for("generate.prompt") && s.prompt.empty())
    errors.fail(cfg, "generate.prompt", "is empty; give the text to continue");
  check_chat_template(cfg, s.model, "generate.chat_template", s.chat_template, errors);
  return s;
}

GenerateSettings resolve_generate(const Config& cfg) {
  ConfigErrors errors;
  GenerateSettings s = resolve_generate(cfg, errors);
  errors.raise_if_any();
  return s;
}

GenerateResult run_generate(const GenerateSettings& s, std::ostream& log) {
  const Tokenizer tok = load_tokenizer(s.model);
  GenerateResult r;
  models::GenerateOptions opts = s.options;
  for (int64_t id : s.model.config.eos_token_ids) opts.eos_token_ids.push_back(id);
  if (tok.eos_id()) opts.eos_token_ids.push_back(*tok.eos_id());
  if (s.chat_template == "none") {
    r.prompt = s.prompt;
    r.prompt_ids = tok.encode(s.prompt, {.add_special_tokens = true});
  } else {
    ChatTemplate tmpl = chat_template_for(s.chat_template, tok);
    std::vector<ChatMessage> messages{{"user", s.prompt}};
    TokenizedChat chat = tokenize_chat(tok, tmpl, messages, {.add_generation_prompt = true});
    r.prompt = render_chat_text(tmpl, messages, {.add_generation_prompt = true});
    r.prompt_ids = chat.ids;
    // The reply ends with the template's end-of-turn token.
    for (const char* end : {"<|eot_id|>", "<|im_end|>"})
      if (auto id = tok.token_to_id(end)) opts.eos_token_ids.push_back(*id);
  }
  INGOT_CHECK(!r.prompt_ids.empty(), "generate.prompt: encodes to no tokens");
  if (tok.pad_id()) opts.pad_token_id = *tok.pad_id();

  models::HFModel hf = models::load_hf_model(s.model.path, s.dtype);
  if (!s.model.adapter.empty()) models::load_lora_adapter(*hf.model, s.model.adapter);
  hf.model->to(s.device);
  const int64_t T = static_cast<int64_t>(r.prompt_ids.size());
  const int64_t positions = hf.model->max_positions();
  INGOT_CHECK(positions == 0 || T + opts.max_new_tokens <= positions, "generate.max_new_tokens: the prompt's ", T,
              " tokens + ", opts.max_new_tokens, " new ones exceed the model's ", positions,
              " positions; lower generate.max_new_tokens or shorten generate.prompt");

  std::vector<int64_t> ids64(r.prompt_ids.begin(), r.prompt_ids.end());
  Tensor prompt = from_vector_i64(ids64, {1, T}, s.device);
  auto t0 = std::chrono::steady_clock::now();
  Tensor out = models::generate(*hf.model, prompt, opts);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> all = out.to_vector();
  for (size_t i = static_cast<size_t>(T); i < all.size(); ++i) r.new_ids.push_back(static_cast<int32_t>(all[i]));
  r.stopped_at_eos = !r.new_ids.empty() && std::find(opts.eos_token_ids.begin(), opts.eos_token_ids.end(),
                                                     r.new_ids.back()) != opts.eos_token_ids.end();
  DecodeOptions decode;
  decode.skip_special_tokens = s.skip_special_tokens;
  r.completion = tok.decode(r.new_ids, decode);
  r.tokens_per_s = static_cast<double>(r.new_ids.size()) / std::max(r.seconds, 1e-9);

  char buf[200];
  std::snprintf(buf, sizeof buf, "generate | %lld prompt tokens -> %lld new (%s) | %.1f tok/s | %s%s\n",
                static_cast<long long>(T), static_cast<long long>(r.new_ids.size()),
                r.stopped_at_eos ? "stopped at EOS" : "max_new_tokens",
                r.tokens_per_s, opts.do_sample ? "sampling" : "greedy", opts.use_cache ? ", KV cache" : "");
  log << buf << std::flush;
  return r;
}

std::string generate_json(const GenerateResult& r) {
  nlohmann::ordered_json j;
  j["prompt"] = r.prompt;
  j["completion"] = r.completion;
  j["prompt_ids"] = r.prompt_ids;
  j["new_ids"] = r.new_ids;
  j["stopped_at_eos"] = r.stopped_at_eos;
  j["seconds"] = r.seconds;
  j["tokens_per_s"] = r.tokens_per_s;
  return j.dump(2) + "\n";
}

}  // namespace ingot::recipes
