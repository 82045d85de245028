#include <gtest/gtest.h>

#include <cmath>

#include "models/hf_config.h"
#include "runtime/error.h"

namespace ingot {
namespace {

using models::HFConfig;
using models::parse_hf_config;
using models::RopeScaling;

const char* kLlama3 = R"({
  "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
  "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0, "max_position_embeddings": 131072, "tie_word_embeddings": true,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16"})";

// Expects parse_hf_config(text) to fail with a message containing every fragment.
void expect_error(const std::string& text, std::vector<std::string> fragments) {
  try {
    parse_hf_config(text, "ckpt/config.json");
    ADD_FAILURE() << "no error for " << text;
  } catch (const Error& e) {
    for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(HFConfig, Llama32ConfigGivesGqaTiedEmbeddingsAndLlama3RopeScaling) {
  HFConfig c = parse_hf_config(kLlama3);
  EXPECT_EQ(c.arch, HFConfig::Arch::Llama);
  EXPECT_EQ(c.llama.num_key_value_heads, 8);
  EXPECT_TRUE(c.llama.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.llama.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.llama.rope_theta, 500000.0);
  EXPECT_EQ(c.llama.rope_scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_DOUBLE_EQ(c.llama.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.llama.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.bos_token_id.value(), 128000);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(HFConfig, Qwen2HasQkvBiasOnlyAndTransformers5RopeParameters) {
  HFConfig c = parse_hf_config(R"({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "use_sliding_window": false,
    "sliding_window": 4096, "layer_types": ["full_attention", "full_attention"], "tie_word_embeddings": true})");
  EXPECT_TRUE(c.llama.attention_bias);
  EXPECT_FALSE(c.llama.attention_out_bias);
  EXPECT_DOUBLE_EQ(c.llama.rope_theta, 1e6);
  EXPECT_EQ(c.llama.rope_scaling.kind, RopeScaling::Kind::None);
  EXPECT_EQ(c.llama.sliding_window, 0);
  EXPECT_EQ(c.llama.max_position_embeddings, 32768);  // Qwen2Config's default
}

TEST(HFConfig, Qwen3NormalizesQAndKHeadsAndDefaultsItsHeadDimTo128) {
  const std::string qwen3 = R"({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "use_sliding_window": false,
    "sliding_window": null, "max_window_layers": 28, "layer_types": ["full_attention", "full_attention"],
    "tie_word_embeddings": true, "attention_bias": false})";
  HFConfig c = parse_hf_config(qwen3);
  EXPECT_TRUE(c.llama.qk_norm);
  EXPECT_FALSE(c.llama.attention_bias || c.llama.attention_out_bias || c.llama.mlp_bias);
  EXPECT_EQ(c.llama.head_dim, 128);  // Qwen3Config's default, not hidden_size / heads = 8
  EXPECT_EQ(c.llama.max_position_embeddings, 32768);
  // attention_bias: q/k/v and o_proj alike (Qwen3Attention), unlike Qwen2's q/k/v only.
  HFConfig b = parse_hf_config(R"({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "attention_bias": true})");
  EXPECT_TRUE(b.llama.attention_bias && b.llama.attention_out_bias);
  // Exported from a model built in ingot: the head_dim is written even when it is hidden_size / heads.
  b.json.clear();
  const std::string text = models::hf_config_json(b, DType::bf16);
  EXPECT_NE(text.find("\"head_dim\": 8"), std::string::npos) << text;
  EXPECT_NE(text.find("Qwen3ForCausalLM"), std::string::npos) << text;
  HFConfig back = parse_hf_config(text);
  EXPECT_TRUE(back.llama.qk_norm);
  EXPECT_TRUE(back.llama.attention_bias && back.llama.attention_out_bias);
  EXPECT_EQ(back.llama.head_dim, 0);  // 8 = 32 / 4: the resolved default
  // A Llama config with q/k norms cannot be written as any other model_type.
  HFConfig l = parse_hf_config(R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4})");
  l.json.clear();
  l.llama.qk_norm = true;
  EXPECT_THROW(models::hf_config_json(l, DType::f32), Error);
}

// The benchmarks' model shapes (scripts/device_lora.sh CONFIG=...) parse before a device call finds out.
TEST(HFConfig, BenchmarkShapesParse) {
  const std::string dir = std::string(INGOT_SOURCE_DIR) + "/bench/configs/";
  HFConfig llama = models::load_hf_config(dir + "llama_8b/config.json");
  EXPECT_EQ(llama.llama.num_hidden_layers, 32);
  EXPECT_FALSE(llama.llama.qk_norm);
  HFConfig qwen3 = models::load_hf_config(dir + "qwen3_8b/config.json");
  EXPECT_TRUE(qwen3.llama.qk_norm);
  EXPECT_EQ(qwen3.llama.num_hidden_layers, 36);
  EXPECT_EQ(qwen3.llama.num_key_value_heads, 8);
  EXPECT_EQ(qwen3.llama.intermediate_size, 12288);
  EXPECT_EQ(qwen3.eos_token_ids, (std::vector<int64_t>{151645}));
}

TEST(HFConfig, MistralKeepsItsSlidingWindowAndDefaultsToEightKvHeads) {
  HFConfig c = parse_hf_config(R"({"model_type": "mistral", "vocab_size": 64, "hidden_size": 64,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 8, "sliding_window": 4096})");
  EXPECT_EQ(c.llama.num_key_value_heads, 8);
  EXPECT_EQ(c.llama.sliding_window, 4096);
  EXPECT_FALSE(c.llama.tie_word_embeddings);
  EXPECT_EQ(c.llama.model_type, "mistral");
}

TEST(HFConfig, LinearRopeScalingAndAttentionBiasForLlama2Style) {
  HFConfig c = parse_hf_config(R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "attention_bias": true,
    "rope_scaling": {"type": "linear", "factor": 4.0}})");
  EXPECT_EQ(c.llama.rope_scaling.kind, RopeScaling::Kind::Linear);
  EXPECT_TRUE(c.llama.attention_bias && c.llama.attention_out_bias);
  EXPECT_EQ(c.llama.num_key_value_heads, 4);  // Llama's default: one kv head per head
  Tensor plain = models::rope_inv_freq(8, 10000.0, {});
  Tensor scaled = models::rope_inv_freq(8, 10000.0, c.llama.rope_scaling);
  for (int64_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(scaled.item_at(i), plain.item_at(i) / 4.0f);
}

TEST(HFConfig, Llama3ScalingKeepsHighFrequenciesAndDividesLowOnes) {
  RopeScaling s;
  s.kind = RopeScaling::Kind::Llama3;
  s.factor = 8.0;
  s.original_max_position_embeddings = 64;
  Tensor plain = models::rope_inv_freq(16, 500000.0, {}), scaled = models::rope_inv_freq(16, 500000.0, s);
  // Wavelength 2*pi/f: below 64/4 kept, above 64/1 divided by 8, blended between. With theta 5e5 and head_dim
  // 16 the wavelengths are 6.3, 32.5, 168, ...: one of each kind.
  int kinds[3] = {0, 0, 0};
  for (int64_t i = 0; i < 8; ++i) {
    const double f = plain.item_at(i), wavelen = 2 * M_PI / f;
    const double g = scaled.item_at(i);
    const int kind = wavelen < 16 ? 0 : wavelen > 64 ? 2 : 1;
    ++kinds[kind];
    if (kind == 0) EXPECT_FLOAT_EQ(g, f);
    if (kind == 2) EXPECT_FLOAT_EQ(g, f / 8);
    if (kind == 1) EXPECT_TRUE(g < f && g > f / 8) << i;
  }
  EXPECT_EQ(kinds[0], 1);
  EXPECT_EQ(kinds[1], 1);
  EXPECT_EQ(kinds[2], 6);
}

TEST(HFConfig, Gpt2DefaultsTieEmbeddingsAndReadsNInner) {
  HFConfig c = parse_hf_config(R"({"model_type": "gpt2", "vocab_size": 100, "n_embd": 32, "n_layer": 2,
    "n_head": 4, "n_positions": 64, "n_inner": 48, "resid_pdrop": 0.0, "layer_norm_epsilon": 1e-6})");
  EXPECT_EQ(c.arch, HFConfig::Arch::GPT2);
  EXPECT_TRUE(c.gpt2.tie_word_embeddings);
  EXPECT_EQ(c.gpt2.n_inner, 48);
  EXPECT_DOUBLE_EQ(c.gpt2.layer_norm_eps, 1e-6);
  auto model = models::make_causal_lm(c);
  EXPECT_EQ(model->state_dict().at("transformer.h.0.mlp.c_fc.weight").shape(), (Shape{48, 32}));
}

TEST(HFConfig, UnsupportedValuesNameTheFileAndTheKey) {
  expect_error(R"({"model_type": "bert"})", {"ckpt/config.json", "model_type", "bert"});
  expect_error(R"({"vocab_size": 3})", {"ckpt/config.json", "missing required key 'model_type'"});
  expect_error("{not json", {"ckpt/config.json", "not valid JSON"});
  const std::string base = R"("model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 4)";
  expect_error("{" + base + R"(, "hidden_act": "gelu"})", {"ckpt/config.json", "hidden_act", "gelu"});
  expect_error("{" + base + R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})",
               {"ckpt/config.json", "rope_scaling", "rope_type", "yarn"});
  expect_error("{" + base + R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})",
               {"original_max_position_embeddings"});
  expect_error("{" + base + R"(, "num_key_value_heads": 3})", {"num_key_value_heads", "3"});
  expect_error("{" + base + R"(, "hidden_size": "32"})", {"hidden_size", "expected an integer"});
  expect_error("{" + base + R"(, "layer_types": ["sliding_attention"]})", {"layer_types", "sliding_attention"});
  expect_error(R"({"model_type": "llama", "vocab_size": 64})", {"ckpt/config.json", "hidden_size"});
  expect_error(R"({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    "use_sliding_window": true})", {"use_sliding_window"});
  expect_error(R"({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "use_sliding_window": true})",
               {"use_sliding_window"});
  expect_error(R"({"model_type": "gemma", "vocab_size": 64})", {"gemma", "qwen3"});
  expect_error(R"({"model_type": "gpt2", "activation_function": "relu"})", {"activation_function", "relu"});
  expect_error(R"({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": true})",
               {"scale_attn_by_inverse_layer_idx"});
}

TEST(HFConfig, ExportedConfigParsesBackToTheSameModel) {
  HFConfig c = parse_hf_config(kLlama3);
  c.json.clear();  // as for a model built in ingot
  HFConfig back = parse_hf_config(models::hf_config_json(c, DType::bf16));
  EXPECT_EQ(back.llama.hidden_size, 2048);
  EXPECT_EQ(back.llama.num_key_value_heads, 8);
  EXPECT_EQ(back.llama.rope_scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_DOUBLE_EQ(back.llama.rope_scaling.factor, 32.0);
  EXPECT_TRUE(back.llama.tie_word_embeddings);
  EXPECT_EQ(back.eos_token_ids, c.eos_token_ids);
  EXPECT_EQ(back.torch_dtype, "bfloat16");
  HFConfig g = models::hf_config_for(models::GPT2Config{});
  EXPECT_EQ(parse_hf_config(models::hf_config_json(g, DType::f32)).gpt2.n_embd, 768);
}

}  // namespace
}  // namespace ingot
