// The fine-tuning recipes on the tiny Hugging Face fixtures (tests/fixtures/hf) and the KJV instruction set
// (tests/fixtures/data): the loss falls, LoRA trains only its adapters, exports reload with the trained
// model's logits, interrupted + resumed runs equal uninterrupted ones bit for bit, and bad inputs are named.
#include "recipes/finetune.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "models/hf_checkpoint.h"
#include "models/peft.h"
#include "recipes/metrics.h"
#include "recipes/registry.h"
#include "runtime/file_util.h"
#include "runtime/safetensors.h"

namespace ingot::recipes {
namespace {

namespace fs = std::filesystem;

const char* kFixtures = "tests/fixtures/hf/";

// The state dict of a safetensors file.
std::map<std::string, Tensor> read_tensors(const std::string& path) {
  SafetensorsFile f = SafetensorsFile::open(path);
  std::map<std::string, Tensor> out;
  for (const std::string& n : f.names()) out[n] = f.get(n);
  return out;
}

double mean_of(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to && i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(std::min(to, v.size()) - from);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.to_vector() == b.to_vector();
}

// Logits of a fixed id sequence [1, 24] (ids < 512, the fixtures' vocabulary).
Tensor probe_logits(models::CausalLM& model) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 24; ++i) ids.push_back((i * 37 + 11) % 500);
  NoGradGuard no_grad;
  model.eval();
  return model.forward(from_vector_i64(ids, {1, 24}));
}

class Finetune : public ::testing::Test {
 public:
  // A validated config of `recipe` on fixture `model`; `extra` overrides come last.
  Config config(const std::string& recipe, const std::string& model, const std::string& out,
                std::vector<std::string> extra = {}) {
    Config c = Config::parse("recipe: " + recipe +
                                 "\ndevice: cpu\nmax_steps: 30\nseed: 5\n"
                                 "tokenizer: {path: tests/fixtures/data/tokenizer}\n"
                                 "data: {format: instruction, path: tests/fixtures/data/kjv_instruct.jsonl, "
                                 "seq_len: 48, chat_template: chatml}\n"
                                 "train: {batch_size: 4, lr: 3.0e-3, warmup_steps: 2, log_every: 10}\n"
                                 "logging: {plot: false}\n",
                             "ft.yaml");
    c.apply_override("model.path=" + std::string(kFixtures) + model);
    c.apply_override("output_dir=" + dir_.file(out));
    for (const std::string& o : extra) c.apply_override(o);
    c.validate(recipe == "lora_finetune" ? lora_finetune_schema() : full_finetune_schema());
    return c;
  }
  // `overrides` with the step compiled, into this test's cache directory.
  std::vector<std::string> compiled(std::vector<std::string> overrides) {
    overrides.push_back("compile.enabled=true");
    overrides.push_back("compile.cache_dir=" + dir_.file("cache"));
    return overrides;
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
  // The allocator peak of each training step (metrics.jsonl's peak_memory_bytes).
  std::vector<int64_t> step_peaks(const std::string& out) {
    std::vector<int64_t> peaks;
    std::ifstream f(dir_.file(out + "/metrics.jsonl"));
    for (std::string line; std::getline(f, line);) {
      nlohmann::json rec = nlohmann::json::parse(line);
      if (rec.value("kind", "") == "train") peaks.push_back(rec.at("peak_memory_bytes").get<int64_t>());
    }
    return peaks;
  }
  // A ConfigError from resolving `c` (empty when there is none).
  static std::string resolve_error(const Config& c) {
    try {
      resolve_finetune(c);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  TempDir dir_{"ingot_finetune_test"};
  std::ostringstream log_;
};

TEST_F(Finetune, FullFinetuneLowersTheLossAndExportsAHuggingFaceCheckpoint) {
  TrainSummary r = run(config("full_finetune", "llama_tiny", "full", {"max_steps=60", "train.lr=1.0e-2"}));
  EXPECT_EQ(r.steps, 60);
  EXPECT_LT(mean_of(losses("full"), 50, 60), mean_of(losses("full"), 0, 10) - 1.5) << log_.str();
  EXPECT_EQ(r.trainable_parameters, r.num_parameters);
  const std::string hf = dir_.file("full/hf");
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                        "generation_config.json"})
    EXPECT_TRUE(fs::is_regular_file(fs::path(hf) / f)) << f;
  EXPECT_TRUE(fs::is_regular_file(dir_.file("full/summary.json")));
  EXPECT_NE(log_.str().find("step 10/60 | loss"), std::string::npos) << log_.str();
}

TEST_F(Finetune, LoraFinetuneLowersTheLossTrainsOnlyAdaptersAndSavesOnlyAdapters) {
  TrainSummary r = run(config("lora_finetune", "llama_tiny", "lora",
                              {"max_steps=60", "train.lr=2.0e-2", "checkpoint.save_every=60",
                               "lora.target_modules=[q_proj, v_proj, lm_head]"}));
  EXPECT_LT(mean_of(losses("lora"), 50, 60), mean_of(losses("lora"), 0, 10) - 0.8) << log_.str();
  EXPECT_LT(r.trainable_parameters, r.num_parameters / 5);

  // The final training checkpoint holds the whole model: every base tensor is the fixture's, bit for bit.
  std::map<std::string, Tensor> trained = read_tensors(dir_.file("lora/checkpoints/step_00000060/model.safetensors"));
  models::HFModel base = models::load_hf_model(std::string(kFixtures) + "llama_tiny");
  int64_t lora_tensors = 0;
  for (const auto& [name, t] : base.model->state_dict()) {
    ASSERT_TRUE(trained.count(name)) << name;
    EXPECT_TRUE(bitwise_equal(trained.at(name), t)) << name << " changed";
  }
  for (const auto& [name, t] : trained) lora_tensors += name.find(".lora_") != std::string::npos;
  EXPECT_EQ(lora_tensors, 2 * (2 * 2 + 1));  // A and B of q_proj and v_proj in 2 layers, and of lm_head

  // The adapter directory holds the adapters only.
  std::map<std::string, Tensor> adapter = read_tensors(dir_.file("lora/adapter/adapter_model.safetensors"));
  EXPECT_EQ(static_cast<int64_t>(adapter.size()), lora_tensors);
  for (const auto& [name, t] : adapter) EXPECT_NE(name.find(".lora_"), std::string::npos) << name;
  EXPECT_TRUE(fs::is_regular_file(dir_.file("lora/adapter/adapter_config.json")));
  EXPECT_TRUE(fs::is_regular_file(dir_.file("lora/hf/model.safetensors")));  // merge_on_export
}

// Issue 24: MFU counts the products that run. The frozen base (every non-embedding weight of the fixture) has
// no weight-gradient product, 4 FLOPs per weight and token; the adapters have all three, 6; attention 12 L T d.
// The old count (6 per weight, frozen or not) is 1.5x this on the base.
TEST_F(Finetune, LoraMfuCountsFourFlopsPerFrozenWeightAndSixPerAdapterWeight) {
  TrainSummary r = run(config("lora_finetune", "llama_tiny", "mfu",
                              {"max_steps=2", "logging.peak_tflops=1", "lora.target_modules=[q_proj, v_proj]"}));
  ASSERT_TRUE(r.mfu && r.tokens_per_s) << log_.str();
  models::HFModel base = models::load_hf_model(std::string(kFixtures) + "llama_tiny");
  const models::LlamaConfig& c = base.config.llama;
  const double frozen = static_cast<double>(base.model->num_parameters() - c.vocab_size * c.hidden_size);
  const double adapters = static_cast<double>(r.trainable_parameters);
  EXPECT_EQ(r.trainable_parameters + base.model->num_parameters(), r.num_parameters);
  const double want = 6 * adapters + 4 * frozen + 12.0 * c.num_hidden_layers * 48 * c.hidden_size;
  EXPECT_NEAR(*r.mfu * 1e12 / *r.tokens_per_s, want, 1e-9 * want);
}

TEST_F(Finetune, FullExportReloadsWithTheTrainedModelsLogitsBitwise) {
  // 0.2 MB shards: the ~0.55 MB model is exported as model-0000k-of-0000n.safetensors plus the index.
  run(config("full_finetune", "gpt2_tiny", "gpt2", {"max_steps=6", "checkpoint.save_every=6", "export.max_shard_mb=0.2"}));
  EXPECT_TRUE(fs::is_regular_file(dir_.file("gpt2/hf/model.safetensors.index.json")));
  EXPECT_TRUE(fs::is_regular_file(dir_.file("gpt2/hf/model-00001-of-00003.safetensors")));
  // The trained weights, as the training checkpoint holds them, in a model built from the fixture.
  models::HFModel trained = models::load_hf_model(std::string(kFixtures) + "gpt2_tiny");
  trained.model->load_state_dict(read_tensors(dir_.file("gpt2/checkpoints/step_00000006/model.safetensors")));
  models::HFModel exported = models::load_hf_model(dir_.file("gpt2/hf"));
  models::HFModel original = models::load_hf_model(std::string(kFixtures) + "gpt2_tiny");
  Tensor want = probe_logits(*trained.model);
  EXPECT_TRUE(bitwise_equal(probe_logits(*exported.model), want));
  EXPECT_FALSE(bitwise_equal(probe_logits(*original.model), want)) << "training changed nothing";
}

TEST_F(Finetune, LoraAdapterAndMergedExportReproduceTheTrainedModel) {
  run(config("lora_finetune", "llama_tiny", "lora", {"max_steps=6", "checkpoint.save_every=6", "train.lr=1.0e-2"}));
  models::HFModel trained = models::load_hf_model(std::string(kFixtures) + "llama_tiny");
  nn::LoRAConfig lc;
  lc.target_modules = {"q_proj", "v_proj"};
  nn::apply_lora(*trained.model, lc);
  trained.model->load_state_dict(read_tensors(dir_.file("lora/checkpoints/step_00000006/model.safetensors")));
  Tensor want = probe_logits(*trained.model);

  models::HFModel with_adapter = models::load_hf_model(std::string(kFixtures) + "llama_tiny");
  models::load_lora_adapter(*with_adapter.model, dir_.file("lora/adapter"));
  EXPECT_TRUE(bitwise_equal(probe_logits(*with_adapter.model), want));

  // Merging rounds W + s * B A once, so the merged model agrees to float precision rather than bitwise.
  models::HFModel merged = models::load_hf_model(dir_.file("lora/hf"));
  std::vector<double> a = probe_logits(*merged.model).to_vector(), b = want.to_vector();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4) << i;
}

// Runs uninterrupted, then crashes after `halt` steps having saved every `every`, resumes, and expects the
// same per-step losses and final export, bit for bit.
void expect_exact_resume(Finetune& t, const std::string& recipe, const std::string& model,
                         std::vector<std::string> extra) {
  extra.push_back("max_steps=12");
  t.run(t.config(recipe, model, "full", extra));
  std::vector<std::string> ckpt = extra;
  ckpt.push_back("checkpoint.save_every=4");
  t.run(t.config(recipe, model, "split", ckpt), /*halt=*/6);
  EXPECT_EQ(t.losses("split").size(), 6u);
  EXPECT_FALSE(fs::exists(t.dir_.file("split/hf"))) << "a crashed run exports nothing";
  ckpt.push_back("resume=true");
  TrainSummary r = t.run(t.config(recipe, model, "split", ckpt));
  EXPECT_EQ(r.resumed_from_step, 4);
  std::vector<double> a = t.losses("full"), b = t.losses("split");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;  // bitwise
  EXPECT_EQ(read_file(t.dir_.file("full/hf/model.safetensors")), read_file(t.dir_.file("split/hf/model.safetensors")));
}

TEST_F(Finetune, FullFinetuneResumesBitwiseAcrossEpochs) {
  // The examples pack into 20 batches of 4 rows x 48 tokens per epoch: 12 steps of 2 micro-batches cross into
  // the second epoch (a new shuffle) after the checkpoint at step 4.
  expect_exact_resume(*this, "full_finetune", "llama_tiny", {"train.gradient_accumulation_steps=2"});
}

// train.trained_head_in_chunks (Note [Logits in chunks]): a trained head's logits made a chunk at a time, its
// gradient made with them, trains as through the whole logits (f32: the same losses up to the order of the chunks'
// sums), eagerly and compiled, with a lower peak (the logits and their gradient are never whole).
TEST_F(Finetune, ATrainedHeadInChunksTrainsLikeTheWholeLogitsInLessMemory) {
  const std::vector<std::string> common = {"max_steps=4", "train.loss_chunks=3", "train.log_every=1"};
  std::vector<std::string> chunked = common;
  chunked.push_back("train.trained_head_in_chunks=true");
  run(config("full_finetune", "llama_tiny", "whole", common));
  run(config("full_finetune", "llama_tiny", "chunked", chunked));
  run(config("full_finetune", "llama_tiny", "chunked_compiled", compiled(chunked)));
  const std::vector<double> a = losses("whole"), b = losses("chunked"), c = losses("chunked_compiled");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  ASSERT_EQ(c.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "step " << i + 1;
    EXPECT_NEAR(c[i], b[i], 1e-5 * b[i]) << "step " << i + 1;
  }
  // CPU, 4 x 48 rows of 512 words: 0.5 MiB less seen at every step; at least 0.25 MiB.
  const std::vector<int64_t> pa = step_peaks("whole"), pb = step_peaks("chunked");
  ASSERT_EQ(pb.size(), pa.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_LT(pb[i], pa[i] - (int64_t{1} << 18)) << "step " << i + 1;
}

TEST_F(Finetune, LoraFinetuneWithDropoutAndPaddingResumesBitwise) {
  expect_exact_resume(*this, "lora_finetune", "mistral_tiny", {"lora.dropout=0.1", "data.packing=false"});
}

// train.master_weights: false (Note [Stochastic rounding], runtime/kernels/scalar_math.h): bf16 weights updated in
// place learn as through f32 masters, a crashed run resumes bit for bit (the rounding is a function of the step,
// so no generator state is saved), the export holds the trained bf16 weights, and settings that cannot work are
// config errors naming the key.
TEST_F(Finetune, Bf16WeightsWithoutMastersTrainLikeMastersAndResumeBitwise) {
  const std::vector<std::string> common = {"max_steps=24", "train.lr=1.0e-2", "dtype=bf16"};
  std::vector<std::string> bare = common;
  bare.push_back("train.master_weights=false");
  run(config("full_finetune", "llama_tiny", "masters", common));
  TrainSummary r = run(config("full_finetune", "llama_tiny", "bare", bare));
  const std::vector<double> a = losses("masters"), b = losses("bare");
  ASSERT_EQ(b.size(), 24u);
  const double drop_a = mean_of(a, 0, 4) - mean_of(a, 20, 24), drop_b = mean_of(b, 0, 4) - mean_of(b, 20, 24);
  EXPECT_GT(drop_a, 0.5) << log_.str();
  EXPECT_NEAR(drop_b, drop_a, 0.1 * drop_a) << log_.str();
  EXPECT_EQ(r.trainable_parameters, r.num_parameters);
  // The export is the weights the run trained: bf16 values, as the model held them.
  std::map<std::string, Tensor> exported = read_tensors(dir_.file("bare/hf/model.safetensors"));
  ASSERT_FALSE(exported.empty());
  for (const auto& [name, t] : exported) EXPECT_EQ(t.dtype(), DType::bf16) << name;

  expect_exact_resume(*this, "full_finetune", "llama_tiny", {"dtype=bf16", "train.master_weights=false"});

  for (const auto& [extra, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"train.master_weights=false"}, "dtype is f32"},
           {{"train.master_weights=false", "dtype=bf16", "optimizer.name=sgd"}, "optimizer.name is sgd"}}) {
    const std::string e = resolve_error(config("full_finetune", "llama_tiny", "bad", extra));
    EXPECT_NE(e.find("train.master_weights"), std::string::npos) << e;
    EXPECT_NE(e.find(says), std::string::npos) << e;
  }
}

TEST_F(Finetune, EpochsSetTheNumberOfSteps) {
  FinetuneSettings s = resolve_finetune(config("full_finetune", "llama_tiny", "e", {"train.epochs=2"}));
  TrainSummary r = run_finetune(s, log_);
  // Two passes over the packed rows, batch 4: steps = 2 * rows / 4 (rows as the header line reports).
  std::string header = log_.str().substr(0, log_.str().find('\n'));
  size_t at = header.find(" batches per epoch");
  ASSERT_NE(at, std::string::npos) << header;
  int64_t per_epoch = std::stoll(header.substr(header.rfind("| ", at) + 2));
  EXPECT_EQ(r.steps, 2 * per_epoch);
}

TEST_F(Finetune, HeldOutExamplesAreEvaluated) {
  TrainSummary r = run(config("full_finetune", "llama_tiny", "v",
                              {"max_steps=8", "data.val_fraction=0.25", "train.eval_every=4", "train.eval_batches=2"}));
  EXPECT_GT(r.val_loss.value_or(0), 0);
  EXPECT_NE(log_.str().find("eval | step 4 | val_loss"), std::string::npos) << log_.str();
  EXPECT_NE(log_.str().find("(+16 held out)"), std::string::npos) << log_.str();
}

TEST_F(Finetune, CompiledStepsFollowTheEagerRunInOneGraph) {
  for (const char* recipe : {"full_finetune", "lora_finetune"}) {
    SCOPED_TRACE(recipe);
    const std::vector<std::string> common = {"max_steps=6", "train.grad_clip=0.5", "train.gradient_accumulation_steps=2"};
    TrainSummary e = run(config(recipe, "llama_tiny", "eager", common));
    const std::vector<std::string> comp = compiled(common);
    TrainSummary c = run(config(recipe, "llama_tiny", "compiled", comp));
    EXPECT_NEAR(c.first_loss, e.first_loss, 1e-5 * e.first_loss);
    EXPECT_NEAR(c.final_loss, e.final_loss, 1e-3 * e.final_loss) << log_.str();
    EXPECT_EQ(c.graphs, 1) << log_.str();
    EXPECT_EQ(c.graph_breaks, 0) << log_.str();
    EXPECT_EQ(c.recompiles, 0);
  }
}

// Qwen3 (per-head q/k norms before RoPE, a head_dim wider than hidden_size / heads): LoRA on q/k/v/o trains,
// the norms stay frozen, the compiled step follows the eager one in one graph, and the merged export reloads as
// a qwen3 checkpoint with the trained model's logits (its transformers parity: HFParity.*/qwen3_tiny).
TEST_F(Finetune, Qwen3LoraTrainsAndCompiledStepsFollowTheEagerRun) {
  const std::vector<std::string> common = {"max_steps=8", "train.lr=2.0e-2",
                                           "lora.target_modules=[q_proj, k_proj, v_proj, o_proj]"};
  TrainSummary e = run(config("lora_finetune", "qwen3_tiny", "q3_eager", common));
  const std::vector<std::string> comp = compiled(common);
  TrainSummary c = run(config("lora_finetune", "qwen3_tiny", "q3_compiled", comp));
  EXPECT_LT(e.final_loss, e.first_loss - 0.1) << log_.str();
  EXPECT_NEAR(c.first_loss, e.first_loss, 1e-5 * e.first_loss);
  EXPECT_NEAR(c.final_loss, e.final_loss, 1e-3 * e.final_loss) << log_.str();
  EXPECT_EQ(c.graphs, 1) << log_.str();
  EXPECT_EQ(c.graph_breaks, 0) << log_.str();
  // The q/k norms are base weights: the adapter holds none of them.
  for (auto& [name, t] : read_tensors(dir_.file("q3_eager/adapter/adapter_model.safetensors")))
    EXPECT_EQ(name.find("_norm"), std::string::npos) << name;
  models::HFModel merged = models::load_hf_model(dir_.file("q3_eager/hf"));
  EXPECT_EQ(merged.config.model_type, "qwen3");
  EXPECT_TRUE(merged.config.llama.qk_norm);
  models::HFModel base = models::load_hf_model(std::string(kFixtures) + "qwen3_tiny");
  EXPECT_EQ(merged.model->state_dict().at("model.layers.1.self_attn.k_norm.weight").to_vector(),
            base.model->state_dict().at("model.layers.1.self_attn.k_norm.weight").to_vector());
}

// bench/reference/peft_lora.py's token file (int32 rows of seq_len + 1 ids): with as many rows as the batch,
// every step trains on the same rows, so the first loss is the base model's mean loss over them, as the peft
// reference computes it; compiled steps follow the eager ones (issue 24's comparison on the device).
TEST_F(Finetune, LoraOnTokenRowsStartsFromTheBaseModelsLossOverThoseRows) {
  const int64_t rows = 4, seq = 32;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < rows * (seq + 1); ++i) ids.push_back(static_cast<int32_t>((i * 131 + 7) % 509));
  const std::string path = dir_.file("rows.bin");
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * sizeof(int32_t)));
  }
  const std::vector<std::string> common = {"data.format=token_rows", "data.path=" + path, "data.seq_len=32",
                                           "data.packing=false", "train.batch_size=4", "max_steps=5",
                                           "train.warmup_steps=0", "lora.merge_on_export=false",
                                           "lora.target_modules=[q_proj, k_proj, v_proj, o_proj]"};
  TrainSummary e = run(config("lora_finetune", "llama_tiny", "eager", common));
  const std::vector<std::string> comp = compiled(common);
  TrainSummary c = run(config("lora_finetune", "llama_tiny", "compiled", comp));

  models::HFModel base = models::load_hf_model(std::string(kFixtures) + "llama_tiny");
  std::vector<int64_t> in, tgt;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < seq; ++t) {
      in.push_back(ids[static_cast<size_t>(r * (seq + 1) + t)]);
      tgt.push_back(ids[static_cast<size_t>(r * (seq + 1) + t + 1)]);
    }
  double want;
  {
    NoGradGuard no_grad;
    want = base.model->loss(from_vector_i64(in, {rows, seq}), from_vector_i64(tgt, {rows, seq})).item();
  }
  EXPECT_NEAR(e.first_loss, want, 1e-5 * want) << log_.str();
  EXPECT_NEAR(c.first_loss, want, 1e-5 * want) << log_.str();
  const std::vector<double> le = losses("eager"), lc = losses("compiled");
  ASSERT_EQ(le.size(), 5u);
  EXPECT_LT(le.back(), le.front());
  for (size_t i = 0; i < le.size(); ++i) EXPECT_NEAR(lc[i], le[i], 1e-3 * le[i]) << "step " << i + 1;
  EXPECT_EQ(c.graph_breaks, 0) << log_.str();
  // The same rows could not fill a packed row's positions: the header says padded rows.
  EXPECT_NE(log_.str().find("batch 4 x 32 padded"), std::string::npos) << log_.str();
  for (const char* bad : {"data.seq_len=31", "data.seq_len=20"}) {
    std::vector<std::string> wrong = common;
    wrong.push_back(bad);
    EXPECT_THROW(run(config("lora_finetune", "llama_tiny", "wrong", wrong)), Error) << bad;
  }
}

// data.shuffle=false reads the rows in file order, as bench/reference/peft_lora.py does with a token file of more rows
// than the batch (the real-text comparison); the default visits them in a seeded order.
TEST_F(Finetune, DataShuffleFalseTrainsOnTheRowsInFileOrder) {
  const int64_t rows = 8, seq = 16, batch = 2;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < rows * (seq + 1); ++i) ids.push_back(static_cast<int32_t>((i * 131 + 7) % 509));
  const std::string path = dir_.file("rows8.bin");
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * sizeof(int32_t)));
  }
  models::HFModel base = models::load_hf_model(std::string(kFixtures) + "llama_tiny");
  auto loss_of_rows = [&](int64_t first) {  // the base model's mean loss over rows [first, first + batch)
    std::vector<int64_t> in, tgt;
    for (int64_t r = first; r < first + batch; ++r)
      for (int64_t t = 0; t < seq; ++t) {
        in.push_back(ids[static_cast<size_t>(r * (seq + 1) + t)]);
        tgt.push_back(ids[static_cast<size_t>(r * (seq + 1) + t + 1)]);
      }
    NoGradGuard no_grad;
    return base.model->loss(from_vector_i64(in, {batch, seq}), from_vector_i64(tgt, {batch, seq})).item();
  };
  const std::vector<std::string> common = {"data.format=token_rows", "data.path=" + path, "data.seq_len=16",
                                           "data.packing=false", "train.batch_size=2", "max_steps=1",
                                           "lora.merge_on_export=false"};
  std::vector<std::string> ordered = common;
  ordered.push_back("data.shuffle=false");
  const double want = loss_of_rows(0);
  EXPECT_NEAR(run(config("lora_finetune", "llama_tiny", "ordered", ordered)).first_loss, want, 1e-5 * want)
      << log_.str();
  // Seeded order (seed 0 does not start with rows 0 and 1): another first batch.
  EXPECT_GT(std::abs(run(config("lora_finetune", "llama_tiny", "shuffled", common)).first_loss - want), 1e-4 * want);
}

// compile.memory_budget applies to LoRA steps: under 0.5 the row norms' outputs the adapters read are recomputed in
// the backward instead of saved (the compiled steps' allocator peak after the first, traced step drops), the losses
// stay the same. (The SwiGLU's silu is remade at every budget: Note [Saved values remade for free].)
TEST_F(Finetune, LoraMemoryBudgetLowersTheCompiledStepsPeakWithTheSameLosses) {
  const std::vector<std::string> common = {"max_steps=3", "compile.enabled=true", "compile.cache_dir=" + dir_.file("cache"),
                                           "lora.target_modules=[q_proj, k_proj, v_proj, o_proj]"};
  std::vector<std::string> half = common;
  half.push_back("compile.memory_budget=0.5");
  run(config("lora_finetune", "llama_tiny", "whole", common));
  run(config("lora_finetune", "llama_tiny", "half", half));
  const std::vector<int64_t> whole = step_peaks("whole"), halved = step_peaks("half");
  ASSERT_EQ(whole.size(), 3u);
  ASSERT_EQ(halved.size(), 3u);
  // llama_tiny: 2 layers of input norms' outputs [4 x 48, 64] f32 (q/k/v's adapters read them) are no longer alive
  // at the peak.
  EXPECT_LE(halved[2], whole[2] - 2 * 4 * 48 * 64 * 4) << whole[2] << " vs " << halved[2];
  const std::vector<double> lw = losses("whole"), lh = losses("half");
  for (size_t i = 0; i < lw.size(); ++i) EXPECT_NEAR(lh[i], lw[i], 1e-6 * lw[i]) << "step " << i + 1;
}

// train.activation_checkpointing: blocks (autograd/checkpoint.h): each decoder block keeps only its input for the
// backward and runs its forward again there, eagerly and in the compiled step; mlp: only the MLP's norm and widening half. The
// losses stay (eager bit for bit: the same ops on the same values), every step's peak drops, and a value other than
// none / blocks / mlp names the key.
TEST_F(Finetune, LoraBlockCheckpointingKeepsTheLossesAndLowersEveryStepsPeak) {
  const std::vector<std::string> common = {"max_steps=3", "compile.cache_dir=" + dir_.file("cache"),
                                           "lora.target_modules=[q_proj, k_proj, v_proj, o_proj]"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    return extra;
  };
  run(config("lora_finetune", "llama_tiny", "eager", with({})));
  run(config("lora_finetune", "llama_tiny", "compiled", with({"compile.enabled=true"})));
  // blocks, and mlp (Note [MLP checkpointing]: the MLP's norm, up-projections and SwiGLU only).
  for (const std::string mode : {"blocks", "mlp"}) {
    SCOPED_TRACE(mode);
    run(config("lora_finetune", "llama_tiny", "eager_" + mode, with({"train.activation_checkpointing=" + mode})));
    run(config("lora_finetune", "llama_tiny", "compiled_" + mode,
               with({"compile.enabled=true", "train.activation_checkpointing=" + mode})));
    EXPECT_EQ(losses("eager_" + mode), losses("eager"));
    const std::vector<double> lc = losses("compiled"), lk = losses("compiled_" + mode);
    ASSERT_EQ(lk.size(), 3u);
    for (size_t i = 0; i < lc.size(); ++i) EXPECT_NEAR(lk[i], lc[i], 1e-6 * lc[i]) << "step " << i + 1;
    for (const std::string pair : {"eager", "compiled"}) {
      const std::vector<int64_t> plain = step_peaks(pair), ckpt = step_peaks(pair + "_" + mode);
      ASSERT_EQ(ckpt.size(), 3u);
      // The traced first step too: it runs the checkpointed regions eagerly.
      for (size_t i = 0; i < 3; ++i) EXPECT_LT(ckpt[i], plain[i]) << pair << " step " << i + 1;
    }
  }
  // train.activation_checkpointing_layers=1: the first of the two blocks only. The same losses; every step's peak
  // between none and both blocks.
  run(config("lora_finetune", "llama_tiny", "eager_mlp_first",
             with({"train.activation_checkpointing=mlp", "train.activation_checkpointing_layers=1"})));
  EXPECT_EQ(losses("eager_mlp_first"), losses("eager"));
  {
    const std::vector<int64_t> plain = step_peaks("eager"), first = step_peaks("eager_mlp_first"),
                               both = step_peaks("eager_mlp");
    ASSERT_EQ(first.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_LT(first[i], plain[i]) << "step " << i + 1;
      EXPECT_GT(first[i], both[i]) << "step " << i + 1;
    }
  }
  auto error_of_config = [&](std::vector<std::string> keys) {
    try {
      run(config("lora_finetune", "llama_tiny", "bad", with(std::move(keys))));
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string bad = error_of_config({"train.activation_checkpointing=layers"});
  EXPECT_NE(bad.find("train.activation_checkpointing"), std::string::npos) << bad;
  const std::string no_mode = error_of_config({"train.activation_checkpointing_layers=1"});
  EXPECT_NE(no_mode.find("train.activation_checkpointing_layers"), std::string::npos) << no_mode;
  EXPECT_NE(no_mode.find("is none"), std::string::npos) << no_mode;
}

// Issue 24's long-context shape on the CPU at a tiny size: LoRA on one row of 8192 tokens with checkpointed blocks
// (RoPE tables, the token rows and attention at T = 8192, none limited by a fixed size), eagerly, starting from the
// base model's loss over that row. The fixture's config allows 64 positions, so a copy says 8192.
TEST_F(Finetune, LoraOnOneRowOf8192TokensWithCheckpointedBlocks) {
  const int64_t seq = 8192;
  const fs::path model = dir_.file("llama_8k");
  fs::copy(std::string(kFixtures) + "llama_tiny", model, fs::copy_options::recursive);
  {
    nlohmann::json c = nlohmann::json::parse(std::ifstream(model / "config.json"));
    c["max_position_embeddings"] = seq;
    std::ofstream(model / "config.json") << c.dump(2);
  }
  std::vector<int32_t> ids;
  for (int64_t i = 0; i <= seq; ++i) ids.push_back(static_cast<int32_t>((i * 131 + 7) % 509));
  const std::string path = dir_.file("row.bin");
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * sizeof(int32_t)));
  }
  TrainSummary r = run(config("lora_finetune", "llama_tiny", "long",
                              {"model.path=" + model.string(), "data.format=token_rows", "data.path=" + path,
                               "data.seq_len=8192", "data.packing=false", "train.batch_size=1", "max_steps=1",
                               "train.warmup_steps=0", "lora.merge_on_export=false",
                               "lora.target_modules=[q_proj, k_proj, v_proj, o_proj]",
                               "train.activation_checkpointing=blocks"}));
  EXPECT_EQ(r.steps, 1);
  models::HFModel base = models::load_hf_model(model.string());
  std::vector<int64_t> in(ids.begin(), ids.end() - 1), tgt(ids.begin() + 1, ids.end());
  double want;
  {
    NoGradGuard no_grad;
    want = base.model->loss(from_vector_i64(in, {1, seq}), from_vector_i64(tgt, {1, seq})).item();
  }
  EXPECT_NEAR(r.first_loss, want, 1e-5 * want) << log_.str();
}

TEST_F(Finetune, Bf16LoraKeepsTheExactBaseWeightsInTheMergedExport) {
  // bf16 rounds the frozen base for compute; the merged export starts again from model.path's own weights.
  run(config("lora_finetune", "llama_tiny", "bf16", {"max_steps=4", "dtype=bf16", "lora.merge_on_export=true",
                                                     "lora.target_modules=[q_proj]"}));
  std::map<std::string, Tensor> base = read_tensors(std::string(kFixtures) + "llama_tiny/model.safetensors");
  std::map<std::string, Tensor> exported = read_tensors(dir_.file("bf16/hf/model.safetensors"));
  for (const auto& [name, t] : base) {
    ASSERT_TRUE(exported.count(name)) << name;
    if (name.find("q_proj") == std::string::npos) EXPECT_TRUE(bitwise_equal(exported.at(name), t)) << name;
    else EXPECT_FALSE(bitwise_equal(exported.at(name), t)) << name << ": the adapter was not merged";
  }
}

// Writes fine-tuned exports with ingot's logits for tests/fixtures/check_hf_export.py, which loads them with
// transformers (and peft) where those are installed:
//   INGOT_HF_EXPORT_DIR=/tmp/x build/bin/ingot_tests --gtest_filter='Finetune.ExportsForTheTransformersCheck'
//   python3 tests/fixtures/check_hf_export.py /tmp/x
TEST_F(Finetune, ExportsForTheTransformersCheck) {
  const char* root = std::getenv("INGOT_HF_EXPORT_DIR");
  if (!root || !*root) GTEST_SKIP() << "set INGOT_HF_EXPORT_DIR to write exports for check_hf_export.py";
  auto reference = [&](models::CausalLM& model, const std::string& dir) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 24; ++i) ids.push_back((i * 37 + 11) % 500);
    Tensor input = from_vector_i64(ids, {1, 24});
    save_safetensors(dir + "/ingot_reference.safetensors", {{"input_ids", input}, {"logits", probe_logits(model)}});
  };
  auto copy = [&](const std::string& from, const std::string& name) {
    const std::string to = std::string(root) + "/" + name;
    fs::remove_all(to);
    fs::create_directories(root);
    fs::copy(from, to, fs::copy_options::recursive);
    return to;
  };
  struct Case {
    const char* recipe;
    const char* model;
    const char* template_name;
  };
  for (Case c : {Case{"full_finetune", "gpt2_tiny", "chatml"}, Case{"full_finetune", "llama3_tiny", "llama3"},
                 Case{"full_finetune", "mistral_tiny", "chatml"}, Case{"lora_finetune", "qwen2_tiny", "chatml"},
                 Case{"lora_finetune", "llama_tiny", "llama3"}, Case{"lora_finetune", "qwen3_tiny", "chatml"}}) {
    const std::string name = std::string(c.recipe) + "_" + c.model;
    std::vector<std::string> extra = {"max_steps=8", std::string("data.chat_template=") + c.template_name};
    if (std::string(c.recipe) == "lora_finetune" && std::string(c.model) == "llama_tiny")
      extra.push_back("lora.target_modules=[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head]");
    run(config(c.recipe, c.model, name, extra));
    std::string hf = copy(dir_.file(name + "/hf"), name + "_hf");
    reference(*models::load_hf_model(hf).model, hf);
    if (std::string(c.recipe) == "lora_finetune") {
      std::string adapter = copy(dir_.file(name + "/adapter"), name + "_adapter");
      models::HFModel m = models::load_hf_model(std::string(kFixtures) + c.model);
      models::load_lora_adapter(*m.model, adapter);
      reference(*m.model, adapter);
    }
  }
}

// --- bad inputs: named, and nothing written -----------------------------------------------------------------

TEST_F(Finetune, AMissingModelDirectoryIsAConfigErrorNamingTheKey) {
  Config c = config("full_finetune", "llama_tiny", "x");
  c.apply_override("model.path=" + dir_.file("no_such_model"));
  std::string msg = resolve_error(c);
  EXPECT_NE(msg.find("model.path: no such checkpoint directory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no_such_model"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir_.file("x")));
}

TEST_F(Finetune, AMissingTensorIsAnErrorNamingItAndNothingIsWritten) {
  // A copy of the fixture without one tensor.
  fs::create_directories(dir_.file("broken"));
  fs::copy_file(std::string(kFixtures) + "llama_tiny/config.json", dir_.file("broken/config.json"));
  std::vector<std::pair<std::string, Tensor>> kept;
  for (auto& [name, t] : read_tensors(std::string(kFixtures) + "llama_tiny/model.safetensors"))
    if (name != "model.layers.1.mlp.up_proj.weight") kept.emplace_back(name, t);
  save_safetensors(dir_.file("broken/model.safetensors"), kept, {{"format", "pt"}});
  Config c = config("full_finetune", "llama_tiny", "x");
  c.apply_override("model.path=" + dir_.file("broken"));
  try {
    run(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_.file("x")));
}

TEST_F(Finetune, ABadJsonlLineIsAnErrorWithItsLineNumberAndNothingIsWritten) {
  std::ifstream in("tests/fixtures/data/kjv_instruct.jsonl");
  std::string text, line;
  for (int i = 0; std::getline(in, line); ++i) text += (i == 6 ? line.substr(0, line.size() / 2) : line) + "\n";
  std::ofstream(dir_.file("bad.jsonl")) << text;
  try {
    run(config("full_finetune", "llama_tiny", "x", {"data.path=" + dir_.file("bad.jsonl")}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:7: malformed JSON"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_.file("x")));
}

TEST_F(Finetune, AnUnknownLoraTargetIsAConfigErrorListingTheProjections) {
  std::string msg = resolve_error(config("lora_finetune", "llama_tiny", "x", {"lora.target_modules=[q_proj, qkv]"}));
  EXPECT_NE(msg.find("lora.target_modules: unknown module 'qkv' for a llama model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"), std::string::npos) << msg;
  msg = resolve_error(config("lora_finetune", "gpt2_tiny", "x"));  // GPT-2 has c_attn, not q_proj
  EXPECT_NE(msg.find("unknown module 'q_proj' for a gpt2 model"), std::string::npos) << msg;
}

TEST_F(Finetune, AllLinearAdaptsEveryProjectionButTheOutputHead) {
  FinetuneSettings s = resolve_finetune(config("lora_finetune", "llama_tiny", "x", {"lora.target_modules=all-linear"}));
  EXPECT_EQ(s.lora_config.target_modules, (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                    "up_proj", "down_proj"}));
  s = resolve_finetune(config("lora_finetune", "gpt2_tiny", "x", {"lora.target_modules=[all-linear]"}));
  EXPECT_EQ(s.lora_config.target_modules, (std::vector<std::string>{"c_attn", "c_proj", "c_fc"}));
  const std::string msg =
      resolve_error(config("lora_finetune", "llama_tiny", "x", {"lora.target_modules=[all-linear, q_proj]"}));
  EXPECT_NE(msg.find("lora.target_modules: 'all-linear' names every projection; write it alone"), std::string::npos)
      << msg;
}

TEST_F(Finetune, AnUnknownChatTemplateIsAConfigErrorAtItsLine) {
  Config c = Config::parse("recipe: full_finetune\nmodel: {path: tests/fixtures/hf/llama_tiny}\n"
                           "data:\n  path: tests/fixtures/data/kjv_instruct.jsonl\n  chat_template: vicuna\n",
                           "ft.yaml");
  try {
    c.validate(full_finetune_schema());
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ft.yaml:5:18: data.chat_template: expected one of auto, llama3, chatml"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Finetune, ATemplateTheTokenizerCannotRenderIsNamed) {
  // The GPT-2 tokenizer layout has no <|start_header_id|>: a fixture-sized tokenizer without chat tokens.
  fs::create_directories(dir_.file("tok"));
  nlohmann::json j = nlohmann::json::parse(read_file("tests/fixtures/data/tokenizer/tokenizer.json"));
  nlohmann::json kept = nlohmann::json::array();
  for (auto& t : j["added_tokens"])
    if (t["content"] != "<|start_header_id|>") kept.push_back(t);
  j["added_tokens"] = kept;
  std::ofstream(dir_.file("tok/tokenizer.json")) << j.dump();
  try {
    run(config("full_finetune", "llama_tiny", "x", {"data.chat_template=llama3", "tokenizer.path=" + dir_.file("tok")}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no <|start_header_id|>"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_.file("x")));
}

TEST_F(Finetune, ASequenceLongerThanTheModelIsAConfigError) {
  std::string msg = resolve_error(config("full_finetune", "llama_tiny", "x", {"data.seq_len=65"}));
  EXPECT_NE(msg.find("data.seq_len: 65 is longer than the model's 64 positions"), std::string::npos) << msg;
}

TEST(FinetuneConfigs, EveryBuiltInConfigValidates) {
  int checked = 0;
  for (const BuiltinConfig& b : list_builtin_configs()) {
    if (b.recipe == "pretrain") continue;  // their data comes from scripts/get_data.sh
    const Recipe* recipe = nullptr;
    EXPECT_NO_THROW(load_and_check(b.path, {"device=cpu"}, &recipe)) << b.path;
    ++checked;
  }
  EXPECT_GE(checked, 6);
}

}  // namespace
}  // namespace ingot::recipes
