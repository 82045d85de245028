#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "models/hf_checkpoint.h"
#include "runtime/file_util.h"
#include "runtime/safetensors.h"

namespace ingot {
namespace {

namespace fs = std::filesystem;
using models::HFModel;

std::string fixture(const std::string& name) { return std::string(INGOT_SOURCE_DIR) + "/tests/fixtures/hf/" + name; }

Tensor reference_ids(const std::string& name) {
  return SafetensorsFile::open(fixture(name) + "/reference.safetensors").get("input_ids");
}

// A checkpoint dir with the fixture's config.json and the fixture's tensors after `edit`.
std::string edited_checkpoint(const TempDir& tmp, const std::string& name,
                              const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  const std::string dir = tmp.file(name);
  fs::create_directories(dir);
  fs::copy_file(fixture(name) + "/config.json", dir + "/config.json");
  SafetensorsFile f = SafetensorsFile::open(fixture(name) + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const std::string& n : f.names()) ts.emplace_back(n, f.get(n));
  edit(ts);
  save_safetensors(dir + "/model.safetensors", ts);
  return dir;
}

std::string load_error(const std::string& dir) {
  try {
    models::load_hf_model(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(HFCheckpoint, ExportReloadsToTheSameLogitsSingleFileAndSharded) {
  TempDir tmp("ingot_hf_");
  for (const char* name : {"gpt2_tiny", "qwen2_tiny"}) {
    SCOPED_TRACE(name);
    HFModel m = models::load_hf_model(fixture(name));
    Tensor ids = reference_ids(name);
    Tensor want = m.model->forward(ids);
    const std::string one = tmp.file(std::string(name) + "_one"), many = tmp.file(std::string(name) + "_many");
    models::save_hf_model(*m.model, m.config, one);
    models::HFSaveOptions small;
    small.max_shard_bytes = 60000;
    models::save_hf_model(*m.model, m.config, many, small);
    EXPECT_TRUE(fs::exists(one + "/model.safetensors"));
    EXPECT_FALSE(fs::exists(one + "/model.safetensors.index.json"));
    EXPECT_TRUE(fs::exists(many + "/model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(many + "/model.safetensors"));
    for (const std::string& d : {one, many})
      EXPECT_EQ(models::load_hf_model(d).model->forward(ids).to_vector(), want.to_vector()) << d;
    // Every shard but the last is within the limit; the index sums every tensor's bytes.
    auto index = nlohmann::json::parse(read_file(many + "/model.safetensors.index.json"));
    int64_t total = 0;
    for (auto& [n, t] : m.model->named_parameters()) total += static_cast<int64_t>(t.nbytes());
    EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
    EXPECT_GT(models::hf_weight_files(many).size(), 0u);
    // Nothing but the checkpoint is left beside it (no temp or old directories).
    for (auto& e : fs::directory_iterator(tmp.path()))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

TEST(HFCheckpoint, Gpt2IsSavedInTheConv1DLayoutTransformersUses) {
  TempDir tmp("ingot_hf_");
  HFModel m = models::load_hf_model(fixture("gpt2_tiny"));
  models::save_hf_model(*m.model, m.config, tmp.file("out"));
  SafetensorsFile orig = SafetensorsFile::open(fixture("gpt2_tiny") + "/model.safetensors");
  SafetensorsFile saved = SafetensorsFile::open(tmp.file("out") + "/model.safetensors");
  for (const std::string& n : {"transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_fc.weight"}) {
    EXPECT_EQ(saved.info(n).shape, orig.info(n).shape) << n;
    EXPECT_EQ(saved.get(n).to_vector(), orig.get(n).to_vector()) << n;
  }
  EXPECT_FALSE(saved.has("lm_head.weight"));  // tied, as transformers saves it
  EXPECT_EQ(saved.metadata().at("format"), "pt");
}

TEST(HFCheckpoint, ExportInBf16WritesBf16TensorsAndDtypeInConfig) {
  TempDir tmp("ingot_hf_");
  HFModel m = models::load_hf_model(fixture("llama_tiny"));
  models::HFSaveOptions o;
  o.dtype = DType::bf16;
  o.extra_files = {fixture("llama_tiny") + "/generation_config.json"};
  models::save_hf_model(*m.model, m.config, tmp.file("bf"), o);
  SafetensorsFile saved = SafetensorsFile::open(tmp.file("bf") + "/model.safetensors");
  EXPECT_EQ(saved.info("lm_head.weight").dtype, DType::bf16);
  EXPECT_EQ(models::load_hf_config(tmp.file("bf")).torch_dtype, "bfloat16");
  EXPECT_TRUE(fs::exists(tmp.file("bf") + "/generation_config.json"));
}

TEST(HFCheckpoint, SavingOverAnExistingCheckpointReplacesItAndAFailedSaveLeavesItUntouched) {
  TempDir tmp("ingot_hf_");
  HFModel m = models::load_hf_model(fixture("llama_tiny"));
  const std::string dir = tmp.file("ckpt");
  models::save_hf_model(*m.model, m.config, dir);
  const std::string before = read_file(dir + "/model.safetensors");
  models::HFSaveOptions bad;
  bad.dtype = DType::i32;
  EXPECT_THROW(models::save_hf_model(*m.model, m.config, dir, bad), Error);
  bad = {};
  bad.extra_files = {tmp.file("does_not_exist.json")};
  EXPECT_THROW(models::save_hf_model(*m.model, m.config, dir, bad), Error);
  EXPECT_EQ(read_file(dir + "/model.safetensors"), before);
  // A second save over it works and leaves no stale shard index.
  models::HFSaveOptions sharded;
  sharded.max_shard_bytes = 100000;
  models::save_hf_model(*m.model, m.config, dir, sharded);
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  models::save_hf_model(*m.model, m.config, dir);
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(read_file(dir + "/model.safetensors"), before);
}

TEST(HFCheckpoint, MissingExtraAndMisshapenTensorsAreNamedAndTheModelIsUntouched) {
  TempDir tmp("ingot_hf_");
  std::string err = load_error(edited_checkpoint(tmp, "llama_tiny", [](auto& ts) {
    std::erase_if(ts, [](auto& p) { return p.first == "model.layers.1.mlp.up_proj.weight"; });
    ts.emplace_back("model.layers.0.self_attn.rotary_extra", zeros({2}));
  }));
  EXPECT_NE(err.find("missing tensors (1): model.layers.1.mlp.up_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("unexpected tensors (1): model.layers.0.self_attn.rotary_extra"), std::string::npos) << err;
  EXPECT_NE(err.find("config.json"), std::string::npos) << err;

  TempDir tmp2("ingot_hf_");
  err = load_error(edited_checkpoint(tmp2, "llama_tiny", [](auto& ts) {
    for (auto& [n, t] : ts)
      if (n == "model.layers.0.self_attn.k_proj.weight") t = zeros({64, 64});
  }));
  EXPECT_NE(err.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("[64, 64]"), std::string::npos) << err;
  EXPECT_NE(err.find("[32, 64]"), std::string::npos) << err;

  TempDir tmp3("ingot_hf_");
  const std::string bad_dtype = edited_checkpoint(tmp3, "llama_tiny", [](auto& ts) {
    for (auto& [n, t] : ts)
      if (n == "model.norm.weight") t = zeros({64}, DType::i32);
  });
  err = load_error(bad_dtype);
  EXPECT_NE(err.find("model.norm.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("i32"), std::string::npos) << err;

  // A failed load into an existing model changes none of its weights.
  HFModel m = models::load_hf_model(fixture("llama_tiny"));
  std::vector<double> before = m.model->state_dict().at("model.embed_tokens.weight").to_vector();
  EXPECT_THROW(models::load_hf_weights(*m.model, m.config, bad_dtype), Error);
  EXPECT_EQ(m.model->state_dict().at("model.embed_tokens.weight").to_vector(), before);
}

TEST(HFCheckpoint, ABrokenShardIndexOrNoWeightsIsAClearError) {
  TempDir tmp("ingot_hf_");
  const std::string dir = tmp.file("sharded");
  fs::copy(fixture("llama_tiny_sharded"), dir);
  fs::remove(dir + "/model-00003-of-00006.safetensors");
  std::string err = load_error(dir);
  EXPECT_NE(err.find("model-00003-of-00006.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("does not exist"), std::string::npos) << err;

  const std::string empty = tmp.file("empty");
  fs::create_directories(empty);
  fs::copy_file(fixture("llama_tiny") + "/config.json", empty + "/config.json");
  err = load_error(empty);
  EXPECT_NE(err.find("no model.safetensors or model.safetensors.index.json"), std::string::npos) << err;
  EXPECT_NE(load_error(tmp.file("nowhere")).find("no config.json"), std::string::npos);

  // An index that puts a tensor in a shard that lacks it.
  const std::string lying = tmp.file("lying");
  fs::copy(fixture("llama_tiny_sharded"), lying);
  auto index = nlohmann::json::parse(read_file(lying + "/model.safetensors.index.json"));
  index["weight_map"]["model.norm.weight"] = "model-00001-of-00006.safetensors";
  write_file_atomic(lying + "/model.safetensors.index.json", [&](std::FILE* f) {
    std::string s = index.dump();
    write_bytes(f, s.data(), s.size());
  });
  err = load_error(lying);
  EXPECT_NE(err.find("model.norm.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("does not hold it"), std::string::npos) << err;
}

TEST(HFCheckpoint, OldGpt2FilesWithoutPrefixAndWithMaskBuffersLoad) {
  TempDir tmp("ingot_hf_");
  const std::string dir = edited_checkpoint(tmp, "gpt2_tiny", [](auto& ts) {
    for (auto& [n, t] : ts) n = n.substr(std::string("transformer.").size());
    ts.emplace_back("h.0.attn.bias", ones({1, 1, 64, 64}));
    ts.emplace_back("h.0.attn.masked_bias", full({}, -1e4));
  });
  HFModel m = models::load_hf_model(dir);
  HFModel ref = models::load_hf_model(fixture("gpt2_tiny"));
  Tensor ids = reference_ids("gpt2_tiny");
  EXPECT_EQ(m.model->forward(ids).to_vector(), ref.model->forward(ids).to_vector());
}

}  // namespace
}  // namespace ingot
