// Exports that transformers must load unchanged. Each exported directory gets ingot_reference.safetensors
// (input_ids, ingot's logits); with INGOT_HF_EXPORT_DIR set they are kept there for
// tests/fixtures/check_hf_export.py, which loads them with transformers (and peft) on a machine that has it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "models/generate.h"
#include "models/hf_checkpoint.h"
#include "models/peft.h"
#include "runtime/file_util.h"
#include "runtime/rng.h"
#include "runtime/safetensors.h"

namespace ingot {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return std::string(INGOT_SOURCE_DIR) + "/tests/fixtures/hf/" + name; }

// Writes dir/ingot_reference.safetensors and checks that ingot reloads dir to the same logits.
void write_reference(const std::string& dir, const Tensor& ids, const Tensor& logits) {
  save_safetensors(dir + "/ingot_reference.safetensors", {{"input_ids", ids}, {"logits", logits.detach()}});
}

TEST(HFExport, ExportedCheckpointsAndAdaptersReloadAndCarryReferencesForTransformers) {
  std::unique_ptr<TempDir> tmp;
  std::string root;
  if (const char* env = std::getenv("INGOT_HF_EXPORT_DIR"); env && *env) {
    root = env;
    fs::create_directories(root);
  } else {
    tmp = std::make_unique<TempDir>("ingot_export_");
    root = tmp->path();
  }
  NoGradGuard ng;
  for (const char* name : {"gpt2_tiny", "llama_tiny", "llama3_tiny", "qwen2_tiny", "mistral_tiny", "qwen3_tiny"}) {
    SCOPED_TRACE(name);
    models::HFModel m = models::load_hf_model(fixture(name));
    Tensor ids = SafetensorsFile::open(fixture(name) + "/reference.safetensors").get("input_ids");
    const std::string out = root + "/" + name;
    models::HFSaveOptions o;
    o.max_shard_bytes = 200000;  // several shards and an index
    models::save_hf_model(*m.model, m.config, out, o);
    Tensor logits = m.model->forward(ids);
    write_reference(out, ids, logits);
    EXPECT_EQ(models::load_hf_model(out).model->forward(ids).to_vector(), logits.to_vector());
  }

  // LoRA on attention and MLP projections with nonzero B: a merged export and a PEFT adapter.
  manual_seed(31);
  models::HFModel m = models::load_hf_model(fixture("llama_tiny"));
  Tensor ids = SafetensorsFile::open(fixture("llama_tiny") + "/reference.safetensors").get("input_ids");
  nn::LoRAConfig cfg{.rank = 4, .alpha = 8, .dropout = 0.0, .target_modules = {"q_proj", "v_proj", "gate_proj"}};
  nn::apply_lora(*m.model, cfg);
  for (auto& [n, t] : nn::lora_state_dict(*m.model)) {
    Tensor w = t;
    if (n.find("lora_B") != std::string::npos) w.copy_(randn(t.shape(), DType::f32, Device::cpu(), 0.0, 0.05));
  }
  Tensor adapted = m.model->forward(ids);
  models::save_hf_model(*m.model, m.config, root + "/llama_tiny_lora_merged");
  // Folding B A into W rounds differently from adding the two paths: about 1e-5 relative here.
  Tensor merged = models::load_hf_model(root + "/llama_tiny_lora_merged").model->forward(ids);
  EXPECT_LE(max_rel_error(merged, adapted, 1e-4, 1e-5), 1.0);
  write_reference(root + "/llama_tiny_lora_merged", ids, merged);
  models::save_lora_adapter(*m.model, cfg, m.config, root + "/llama_tiny_lora_adapter", fixture("llama_tiny"));
  write_reference(root + "/llama_tiny_lora_adapter", ids, adapted);

  // A bf16 export: the reference is the f32 forward of the rounded weights, which is what transformers computes
  // when it loads the file in float32.
  models::HFModel q = models::load_hf_model(fixture("qwen2_tiny"));
  models::HFSaveOptions bf;
  bf.dtype = DType::bf16;
  models::save_hf_model(*q.model, q.config, root + "/qwen2_tiny_bf16", bf);
  Tensor qids = SafetensorsFile::open(fixture("qwen2_tiny") + "/reference.safetensors").get("input_ids");
  Tensor rounded = models::load_hf_model(root + "/qwen2_tiny_bf16").model->forward(qids);
  write_reference(root + "/qwen2_tiny_bf16", qids, rounded);
  EXPECT_GT(max_rel_error(rounded, q.model->forward(qids), 0, 1e-6), 1.0);  // the rounding is visible
  EXPECT_LE(max_rel_error(rounded, q.model->forward(qids), 0.05, 0.05), 1.0);
}

}  // namespace
}  // namespace ingot
