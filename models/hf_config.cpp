#include "models/hf_config.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "runtime/file_util.h"

namespace ingot::models {
namespace {

using nlohmann::json;

// Typed access to config.json keys; every failure names the file and the key.
class Keys {
 public:
  Keys(const json& j, const std::string& source, std::string prefix = "")
      : j_(j), source_(source), prefix_(std::move(prefix)) {}

  bool has(const std::string& k) const { return j_.contains(k) && !j_.at(k).is_null(); }
  const json& at(const std::string& k) const { return j_.at(k); }
  std::string where(const std::string& k) const { return source_ + ": key '" + prefix_ + k + "'"; }

  int64_t integer(const std::string& k, std::optional<int64_t> def = std::nullopt) const {
    if (!has(k)) {
      INGOT_CHECK(def.has_value(), source_, ": missing required key '", prefix_, k, "'");
      return *def;
    }
    const json& v = j_.at(k);
    INGOT_CHECK(v.is_number_integer(), where(k), ": expected an integer, got ", v.dump());
    return v.get<int64_t>();
  }
  int64_t positive(const std::string& k, std::optional<int64_t> def = std::nullopt) const {
    int64_t v = integer(k, def);
    INGOT_CHECK(v > 0, where(k), ": expected a positive integer, got ", v);
    return v;
  }
  double number(const std::string& k, double def) const {
    if (!has(k)) return def;
    const json& v = j_.at(k);
    INGOT_CHECK(v.is_number(), where(k), ": expected a number, got ", v.dump());
    return v.get<double>();
  }
  bool boolean(const std::string& k, bool def) const {
    if (!has(k)) return def;
    const json& v = j_.at(k);
    INGOT_CHECK(v.is_boolean(), where(k), ": expected true or false, got ", v.dump());
    return v.get<bool>();
  }
  std::string string(const std::string& k, const std::string& def) const {
    if (!has(k)) return def;
    const json& v = j_.at(k);
    INGOT_CHECK(v.is_string(), where(k), ": expected a string, got ", v.dump());
    return v.get<std::string>();
  }
  // A key whose only supported value is `want`.
  void require(const std::string& k, const json& want, const std::string& why) const {
    if (!has(k)) return;
    INGOT_CHECK(j_.at(k) == want, where(k), ": ", j_.at(k).dump(), " is not supported (", why, ")");
  }

 private:
  const json& j_;
  std::string source_;
  std::string prefix_;
};

// rope_type and its parameters from `r`, an object with "rope_type" (or the older "type") and its factors.
RopeScaling parse_rope_kind(const Keys& r, const std::string& src) {
  RopeScaling s;
  const std::string type_key = r.has("rope_type") ? "rope_type" : "type";
  const std::string type = r.string(type_key, "default");
  if (type == "default") return s;
  s.factor = r.number("factor", 1.0);
  INGOT_CHECK(s.factor >= 1.0, src, ".factor: expected >= 1, got ", s.factor);
  if (type == "linear") {
    s.kind = RopeScaling::Kind::Linear;
  } else if (type == "llama3") {
    s.kind = RopeScaling::Kind::Llama3;
    s.low_freq_factor = r.number("low_freq_factor", 1.0);
    s.high_freq_factor = r.number("high_freq_factor", 4.0);
    s.original_max_position_embeddings = r.positive("original_max_position_embeddings");
    INGOT_CHECK(s.high_freq_factor > s.low_freq_factor, src, ": high_freq_factor (", s.high_freq_factor,
                ") must exceed low_freq_factor (", s.low_freq_factor, ")");
  } else {
    INGOT_CHECK(false, src, ".", type_key, ": '", type, "' is not supported (supported: default, linear, llama3)");
  }
  return s;
}

// transformers < 5 writes "rope_theta" and "rope_scaling"; transformers 5 writes one "rope_parameters" object
// holding rope_theta, rope_type and the factors.
void parse_rope(const Keys& k, double& theta, RopeScaling& scaling) {
  if (k.has("rope_parameters")) {
    const json& rp = k.at("rope_parameters");
    const std::string src = k.where("rope_parameters");
    INGOT_CHECK(rp.is_object() && (rp.contains("rope_theta") || rp.contains("rope_type")), src,
                ": expected one object with rope_theta and rope_type (per-layer-type rope parameters are not "
                "supported), got ",
                rp.dump());
    Keys r(rp, src);
    theta = r.number("rope_theta", k.number("rope_theta", 10000.0));
    INGOT_CHECK(theta > 0, src, ".rope_theta: expected a positive number, got ", theta);
    scaling = parse_rope_kind(r, src);
    return;
  }
  theta = k.number("rope_theta", 10000.0);
  INGOT_CHECK(theta > 0, k.where("rope_theta"), ": expected a positive number, got ", theta);
  if (!k.has("rope_scaling")) return;
  const json& rs = k.at("rope_scaling");
  INGOT_CHECK(rs.is_object(), k.where("rope_scaling"), ": expected an object or null, got ", rs.dump());
  const std::string src = k.where("rope_scaling");
  scaling = parse_rope_kind(Keys(rs, src), src);
}

void parse_gpt2(const Keys& k, HFConfig& out) {
  GPT2Config& c = out.gpt2;
  c.vocab_size = k.positive("vocab_size", 50257);
  c.n_positions = k.positive("n_positions", 1024);
  c.n_embd = k.positive("n_embd", 768);
  c.n_layer = k.positive("n_layer", 12);
  c.n_head = k.positive("n_head", 12);
  c.n_inner = k.has("n_inner") ? k.positive("n_inner") : 0;
  INGOT_CHECK(c.n_embd % c.n_head == 0, k.where("n_embd"), ": ", c.n_embd, " is not a multiple of n_head (",
              c.n_head, ")");
  c.layer_norm_eps = k.number("layer_norm_epsilon", 1e-5);
  c.initializer_range = k.number("initializer_range", 0.02);
  // One dropout rate serves embeddings and residuals; attention-probability dropout is not implemented.
  c.dropout = k.number("resid_pdrop", 0.1);
  c.tie_word_embeddings = k.boolean("tie_word_embeddings", true);
  const std::string act = k.string("activation_function", "gelu_new");
  INGOT_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", k.where("activation_function"), ": '", act,
              "' is not supported (supported: gelu_new, gelu_pytorch_tanh)");
  k.require("scale_attn_weights", true, "attention is always scaled by 1/sqrt(head_dim)");
  k.require("scale_attn_by_inverse_layer_idx", false, "per-layer attention scaling is not implemented");
  k.require("add_cross_attention", false, "GPT-2 here is decoder-only");
}

void parse_llama(const Keys& k, HFConfig& out) {
  LlamaConfig& c = out.llama;
  const std::string& t = out.model_type;
  c.model_type = t;
  c.vocab_size = k.positive("vocab_size");
  c.hidden_size = k.positive("hidden_size");
  c.intermediate_size = k.positive("intermediate_size");
  c.num_hidden_layers = k.positive("num_hidden_layers");
  c.num_attention_heads = k.positive("num_attention_heads");
  // transformers' class defaults: Llama falls back to MHA, Mistral to 8 kv heads, Qwen2 and Qwen3 to 32.
  const int64_t kv_default = t == "mistral" ? 8 : (t == "qwen2" || t == "qwen3") ? 32 : c.num_attention_heads;
  c.num_key_value_heads = k.positive("num_key_value_heads", kv_default);
  INGOT_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, k.where("num_key_value_heads"), ": ",
              c.num_key_value_heads, " does not divide num_attention_heads (", c.num_attention_heads, ")");
  const bool divisible = c.hidden_size % c.num_attention_heads == 0;
  // Qwen3Config's head_dim defaults to 128 whatever the hidden size; the others' to hidden_size / heads.
  c.head_dim = k.has("head_dim") ? k.positive("head_dim") : t == "qwen3" ? 128 : 0;
  if (c.head_dim == 0) {
    INGOT_CHECK(divisible, k.where("hidden_size"), ": ", c.hidden_size, " is not a multiple of num_attention_heads (",
                c.num_attention_heads, ") and there is no head_dim");
  } else if (divisible && c.head_dim == c.hidden_size / c.num_attention_heads) {
    c.head_dim = 0;
  }
  INGOT_CHECK(c.head_dim % 2 == 0, k.where("head_dim"), ": rotary embeddings need an even head_dim, got ", c.head_dim);
  c.rms_norm_eps = k.number("rms_norm_eps", 1e-6);
  parse_rope(k, c.rope_theta, c.rope_scaling);
  const int64_t max_pos_default = t == "mistral" ? 4096 * 32 : (t == "qwen2" || t == "qwen3") ? 32768 : 2048;
  c.max_position_embeddings = k.positive("max_position_embeddings", max_pos_default);
  c.tie_word_embeddings = k.boolean("tie_word_embeddings", false);
  c.initializer_range = k.number("initializer_range", 0.02);
  const std::string act = k.string("hidden_act", "silu");
  INGOT_CHECK(act == "silu", k.where("hidden_act"), ": '", act, "' is not supported (the Llama family uses silu)");
  k.require("attention_dropout", 0.0, "attention-probability dropout is not implemented");
  if (t == "qwen2") {
    // Qwen2 always has q/k/v biases and no o_proj bias; its sliding window applies only when enabled.
    c.attention_bias = true;
    c.attention_out_bias = false;
    k.require("use_sliding_window", false, "sliding-window attention is not implemented");
  } else if (t == "qwen3") {
    // Qwen3: attention_bias puts biases on q/k/v and o_proj alike, the MLP has none, and every layer normalizes
    // each head of q and k (q_norm, k_norm) before RoPE.
    c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
    c.qk_norm = true;
    k.require("use_sliding_window", false, "sliding-window attention is not implemented");
  } else {
    c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
    c.mlp_bias = k.boolean("mlp_bias", false);
  }
  if (k.has("layer_types")) {
    const json& lt = k.at("layer_types");
    INGOT_CHECK(lt.is_array(), k.where("layer_types"), ": expected a list, got ", lt.dump());
    for (const json& x : lt)
      INGOT_CHECK(x == "full_attention", k.where("layer_types"), ": ", x.dump(),
                  " is not supported (only full_attention layers are implemented)");
  }
  if (t == "mistral") c.sliding_window = k.has("sliding_window") ? k.positive("sliding_window") : 0;
}

}  // namespace

HFConfig parse_hf_config(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    INGOT_CHECK(false, source, ": not valid JSON: ", e.what());
  }
  INGOT_CHECK(j.is_object(), source, ": expected a JSON object at the top level");
  HFConfig out;
  out.source = source;
  out.json = json_text;
  Keys k(j, source);
  INGOT_CHECK(k.has("model_type"), source, ": missing required key 'model_type'");
  out.model_type = k.string("model_type", "");
  if (out.model_type == "gpt2") {
    out.arch = HFConfig::Arch::GPT2;
    parse_gpt2(k, out);
  } else if (out.model_type == "llama" || out.model_type == "mistral" || out.model_type == "qwen2" ||
             out.model_type == "qwen3") {
    out.arch = HFConfig::Arch::Llama;
    parse_llama(k, out);
  } else {
    INGOT_CHECK(false, k.where("model_type"), ": '", out.model_type,
                "' is not supported (supported: gpt2, llama, mistral, qwen2, qwen3)");
  }
  if (k.has("bos_token_id")) out.bos_token_id = k.integer("bos_token_id");
  if (k.has("pad_token_id")) out.pad_token_id = k.integer("pad_token_id");
  if (k.has("eos_token_id")) {
    const json& e = k.at("eos_token_id");
    if (e.is_array()) {
      for (const json& x : e) {
        INGOT_CHECK(x.is_number_integer(), k.where("eos_token_id"), ": expected integers, got ", e.dump());
        out.eos_token_ids.push_back(x.get<int64_t>());
      }
    } else {
      out.eos_token_ids.push_back(k.integer("eos_token_id"));
    }
  }
  out.torch_dtype = k.string("torch_dtype", k.string("dtype", ""));
  return out;
}

HFConfig load_hf_config(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) file = (std::filesystem::path(path) / "config.json").string();
  INGOT_CHECK(std::filesystem::exists(file), "no config.json at ", file);
  return parse_hf_config(read_file(file), file);
}

std::shared_ptr<CausalLM> make_causal_lm(const HFConfig& cfg) {
  if (cfg.arch == HFConfig::Arch::GPT2) return std::make_shared<GPT2>(cfg.gpt2);
  return std::make_shared<Llama>(cfg.llama);
}

HFConfig hf_config_for(const GPT2Config& c) {
  HFConfig h;
  h.model_type = "gpt2";
  h.arch = HFConfig::Arch::GPT2;
  h.gpt2 = c;
  h.source = "(GPT2Config)";
  return h;
}

HFConfig hf_config_for(const LlamaConfig& c) {
  HFConfig h;
  h.model_type = c.model_type;
  h.arch = HFConfig::Arch::Llama;
  h.llama = c;
  h.source = "(LlamaConfig)";
  return h;
}

HFConfig hf_config_for(const CausalLM& model) {
  if (auto* g = dynamic_cast<const GPT2*>(&model)) return hf_config_for(g->config());
  if (auto* l = dynamic_cast<const Llama*>(&model)) return hf_config_for(l->config());
  INGOT_CHECK(false, "hf_config_for: only GPT2 and Llama models have a Hugging Face config");
  return {};
}

std::string hf_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: break;
  }
  INGOT_CHECK(false, "Hugging Face export: unsupported dtype ", dtype_name(dtype), " (use f32, bf16 or f16)");
  return "";
}

std::string hf_config_json(const HFConfig& cfg, DType dtype) {
  json j;
  if (!cfg.json.empty()) {
    j = json::parse(cfg.json);
  } else if (cfg.arch == HFConfig::Arch::GPT2) {
    const GPT2Config& c = cfg.gpt2;
    j = {{"model_type", "gpt2"},
         {"architectures", {"GPT2LMHeadModel"}},
         {"vocab_size", c.vocab_size},
         {"n_positions", c.n_positions},
         {"n_embd", c.n_embd},
         {"n_layer", c.n_layer},
         {"n_head", c.n_head},
         {"n_inner", c.n_inner > 0 ? json(c.n_inner) : json(nullptr)},
         {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", c.layer_norm_eps},
         {"resid_pdrop", c.dropout},
         {"embd_pdrop", c.dropout},
         {"attn_pdrop", 0.0},
         {"initializer_range", c.initializer_range},
         {"tie_word_embeddings", c.tie_word_embeddings}};
  } else {
    const LlamaConfig& c = cfg.llama;
    const std::string arch = c.model_type == "qwen2"     ? "Qwen2ForCausalLM"
                             : c.model_type == "qwen3"   ? "Qwen3ForCausalLM"
                             : c.model_type == "mistral" ? "MistralForCausalLM"
                                                         : "LlamaForCausalLM";
    INGOT_CHECK(c.qk_norm == (c.model_type == "qwen3"), "Hugging Face export: model_type '", c.model_type, "' ",
                c.qk_norm ? "has no q/k norms; use model_type qwen3" : "always has q/k norms (qk_norm)");
    j = {{"model_type", c.model_type},
         {"architectures", {arch}},
         {"vocab_size", c.vocab_size},
         {"hidden_size", c.hidden_size},
         {"intermediate_size", c.intermediate_size},
         {"num_hidden_layers", c.num_hidden_layers},
         {"num_attention_heads", c.num_attention_heads},
         {"num_key_value_heads", c.num_key_value_heads},
         {"hidden_act", "silu"},
         {"rms_norm_eps", c.rms_norm_eps},
         {"rope_theta", c.rope_theta},
         {"max_position_embeddings", c.max_position_embeddings},
         {"initializer_range", c.initializer_range},
         {"tie_word_embeddings", c.tie_word_embeddings}};
    // Qwen3's head_dim defaults to 128, not hidden_size / heads: always written for it.
    if (c.head_dim > 0 || c.model_type == "qwen3")
      j["head_dim"] = c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads;
    if (c.model_type == "qwen2") {
      INGOT_CHECK(c.attention_bias && !c.attention_out_bias && !c.mlp_bias,
                  "Hugging Face export: a qwen2 model has q/k/v biases only");
      j["use_sliding_window"] = false;
    } else if (c.model_type == "qwen3") {
      INGOT_CHECK(c.attention_bias == c.attention_out_bias && !c.mlp_bias,
                  "Hugging Face export: a qwen3 model has no MLP biases and q/k/v and o_proj biases together");
      j["attention_bias"] = c.attention_bias;
      j["use_sliding_window"] = false;
    } else {
      INGOT_CHECK(c.attention_bias == c.attention_out_bias,
                  "Hugging Face export: model_type '", c.model_type,
                  "' has q/k/v and o_proj biases together (attention_bias); use model_type qwen2 for q/k/v only");
      j["attention_bias"] = c.attention_bias;
      j["mlp_bias"] = c.mlp_bias;
    }
    if (c.model_type == "mistral") j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    const RopeScaling& s = c.rope_scaling;
    if (s.kind == RopeScaling::Kind::Linear) {
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.factor}};
    } else if (s.kind == RopeScaling::Kind::Llama3) {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", s.factor},
                           {"low_freq_factor", s.low_freq_factor},
                           {"high_freq_factor", s.high_freq_factor},
                           {"original_max_position_embeddings", s.original_max_position_embeddings}};
    }
  }
  if (cfg.json.empty()) {
    if (cfg.bos_token_id) j["bos_token_id"] = *cfg.bos_token_id;
    if (cfg.pad_token_id) j["pad_token_id"] = *cfg.pad_token_id;
    if (cfg.eos_token_ids.size() == 1) j["eos_token_id"] = cfg.eos_token_ids[0];
    if (cfg.eos_token_ids.size() > 1) j["eos_token_id"] = cfg.eos_token_ids;
  }
  // transformers >= 4.56 writes "dtype"; older versions "torch_dtype". Keep whichever the file used.
  j[j.contains("dtype") && !j.contains("torch_dtype") ? "dtype" : "torch_dtype"] = hf_dtype_name(dtype);
  return j.dump(2) + "\n";
}

}  // namespace ingot::models
