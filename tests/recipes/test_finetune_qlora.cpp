// lora_finetune with lora.quantize_base: nf4 (QLoRA) on the tiny Llama fixture: the loss falls as with a dense
// base, the header reports the NF4 bytes, checkpoints (which hold no base values) resume, the merged export starts from the checkpoint's own
// weights, compiled steps follow the eager run, and a bad value is a config error naming the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "recipes/finetune.h"
#include "recipes/metrics.h"
#include "runtime/file_util.h"
#include "runtime/safetensors.h"

namespace ingot::recipes {
namespace {

namespace fs = std::filesystem;

const std::string kModel = "tests/fixtures/hf/llama_tiny";

class QLoRAFinetune : public ::testing::Test {
 public:
  Config config(const std::string& out, std::vector<std::string> extra = {}) {
    Config c = Config::parse(
        "recipe: lora_finetune\ndevice: cpu\nmax_steps: 40\nseed: 5\n"
        "tokenizer: {path: tests/fixtures/data/tokenizer}\n"
        "data: {format: instruction, path: tests/fixtures/data/kjv_instruct.jsonl, seq_len: 48, chat_template: chatml}\n"
        "train: {batch_size: 4, lr: 2.0e-2, warmup_steps: 2, log_every: 10}\n"
        "lora: {target_modules: [q_proj, v_proj, lm_head]}\n"
        "logging: {plot: false}\n",
        "qlora.yaml");
    c.apply_override("model.path=" + kModel);
    c.apply_override("output_dir=" + dir_.file(out));
    for (const std::string& o : extra) c.apply_override(o);
    c.validate(lora_finetune_schema());
    return c;
  }
  TrainSummary run(const Config& c, int64_t halt = 0) {
    FinetuneSettings s = resolve_finetune(c);
    s.halt_after_steps = halt;
    return run_finetune(s, log_);
  }
  std::vector<double> losses(const std::string& out) {
    std::vector<double> l;
    for (const MetricPoint& p : read_metrics(dir_.file(out + "/metrics.jsonl")))
      if (p.kind == "train") l.push_back(p.value);
    return l;
  }
  TempDir dir_{"ingot_qlora_test"};
  std::ostringstream log_;
};

double mean(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / static_cast<double>(to - from);
}

TEST_F(QLoRAFinetune, Nf4BaseTrainsLikeADenseBaseAndReportsItsBytes) {
  const TrainSummary q = run(config("nf4", {"lora.quantize_base=nf4", "checkpoint.save_every=40"}));
  const TrainSummary d = run(config("dense"));
  const std::vector<double> lq = losses("nf4"), ld = losses("dense");
  ASSERT_EQ(lq.size(), 40u);
  EXPECT_LT(mean(lq, 35, 40), mean(lq, 0, 5) - 0.5) << log_.str();
  // NF4 moves the base weights by a few percent of their scale; the fine-tune lands close to the dense one.
  EXPECT_NEAR(mean(lq, 35, 40), mean(ld, 35, 40), 0.05 * mean(ld, 35, 40)) << log_.str();
  EXPECT_EQ(q.trainable_parameters, d.trainable_parameters);
  // 14 projections of 2 blocks; lm_head, embeddings and norms stay dense.
  EXPECT_NE(log_.str().find("NF4 base: 14 weights"), std::string::npos) << log_.str();

  // The merged export starts again from the checkpoint's own weights: untouched projections are bitwise the
  // fixture's, adapted ones moved.
  SafetensorsFile base = SafetensorsFile::open(kModel + "/model.safetensors");
  SafetensorsFile exported = SafetensorsFile::open(dir_.file("nf4/hf/model.safetensors"));
  for (const std::string& name : base.names()) {
    ASSERT_TRUE(exported.has(name)) << name;
    const bool adapted = name.find("q_proj") != std::string::npos || name.find("v_proj") != std::string::npos ||
                         name.find("lm_head") != std::string::npos;
    EXPECT_EQ(exported.get(name).to_vector() == base.get(name).to_vector(), !adapted) << name;
  }
  EXPECT_TRUE(fs::is_regular_file(dir_.file("nf4/adapter/adapter_model.safetensors")));
}

TEST_F(QLoRAFinetune, Bf16ComputeOverAnNf4BaseTrainsAndExportsTheCheckpointsOwnWeights) {
  const TrainSummary r = run(config("bf16", {"lora.quantize_base=nf4", "dtype=bf16", "max_steps=20"}));
  const std::vector<double> l = losses("bf16");
  ASSERT_EQ(l.size(), 20u);
  EXPECT_LT(mean(l, 15, 20), mean(l, 0, 5)) << log_.str();
  EXPECT_EQ(r.steps, 20);
  SafetensorsFile base = SafetensorsFile::open(kModel + "/model.safetensors");
  SafetensorsFile exported = SafetensorsFile::open(dir_.file("bf16/hf/model.safetensors"));
  for (const std::string& name : base.names()) {
    if (name.find("k_proj") != std::string::npos || name.find("mlp") != std::string::npos) {
      EXPECT_EQ(exported.get(name).to_vector(), base.get(name).to_vector()) << name << ": not the checkpoint's own";
    }
  }
}

TEST_F(QLoRAFinetune, ResumesFromACheckpointBitwise) {
  const std::vector<std::string> common = {"lora.quantize_base=nf4", "max_steps=8"};
  run(config("full", common));
  std::vector<std::string> split = common;
  split.push_back("checkpoint.save_every=4");
  run(config("split", split), /*halt=*/6);
  // The checkpoint holds the adapters and the dense parts; the NF4 projections are requantized on resume.
  SafetensorsFile ckpt = SafetensorsFile::open(dir_.file("split/checkpoints/step_00000004/model.safetensors"));
  EXPECT_EQ(ckpt.get("model.layers.0.mlp.up_proj.weight").numel(), 0);
  EXPECT_EQ(ckpt.get("model.embed_tokens.weight").numel(), 512 * 64);
  split.push_back("resume=true");
  const TrainSummary r = run(config("split", split));
  EXPECT_EQ(r.resumed_from_step, 4);
  EXPECT_EQ(losses("full"), losses("split"));
}

TEST_F(QLoRAFinetune, CompiledStepsFollowTheEagerRun) {
  const std::vector<std::string> common = {"lora.quantize_base=nf4", "max_steps=4"};
  const TrainSummary e = run(config("eager", common));
  std::vector<std::string> comp = common;
  comp.push_back("compile.enabled=true");
  comp.push_back("compile.cache_dir=" + dir_.file("cache"));
  const TrainSummary c = run(config("compiled", comp));
  EXPECT_NEAR(c.first_loss, e.first_loss, 1e-5 * e.first_loss) << log_.str();
  EXPECT_NEAR(c.final_loss, e.final_loss, 1e-3 * e.final_loss) << log_.str();
  EXPECT_EQ(c.graph_breaks, 0) << log_.str();
}

TEST_F(QLoRAFinetune, AnUnknownQuantizationIsAConfigErrorNamingTheKey) {
  std::string msg;
  try {
    config("x", {"lora.quantize_base=int4"});
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("lora.quantize_base"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nf4"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ingot::recipes
