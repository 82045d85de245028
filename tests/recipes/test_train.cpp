#include "recipes/train.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "recipes/metrics.h"
#include "runtime/file_util.h"
#include "runtime/safetensors.h"
#include "tests/testing.h"

namespace ingot::recipes {
namespace {

namespace fs = std::filesystem;

class Pretrain : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string text;
    for (int i = 0; i < 40; ++i) text += "And God said, Let there be light: and there was light.\n";
    std::ofstream(dir_.file("text.txt")) << text;
  }
  // A tiny validated config over the test text; `extra` overrides are applied before validation.
  Config tiny(std::vector<std::string> extra = {}) {
    Config c = Config::parse(
        "device: cpu\nmax_steps: 12\nseed: 3\n"
        "model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 8}\n"
        "train: {batch_size: 8, lr: 1.0e-2, warmup_steps: 2, log_every: 4, eval_batches: 2}\n",
        "tiny.yaml");
    c.apply_override("data.path=" + dir_.file("text.txt"));
    c.apply_override("output_dir=" + dir_.file("out"));
    for (const std::string& o : extra) c.apply_override(o);
    c.validate(pretrain_schema());
    return c;
  }
  std::string resolve_error(std::vector<std::string> extra) {
    Config c = tiny(std::move(extra));
    try {
      resolve_pretrain(c);
    } catch (const ConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a ConfigError";
    return "";
  }
  TempDir dir_{"ingot_pretrain_test"};
};

TEST(PretrainSchema, TheQuickstartConfigIsValid) {
  Config c = Config::load(std::string(INGOT_SOURCE_DIR) + "/configs/quickstart.yaml");
  EXPECT_NO_THROW(c.validate(pretrain_schema()));
  EXPECT_EQ(c.get_string("data.path"), "data/kjv.txt");
  EXPECT_EQ(c.get_string("device"), "auto");
}

TEST(PretrainSchema, HasTheKeysEveryLaterRecipeReliesOn) {
  const std::vector<std::string> keys = {"device",
                                         "max_steps",
                                         "seed",
                                         "output_dir",
                                         "resume",
                                         "compile.enabled",
                                         "compile.mode",
                                         "dtype",
                                         "model.n_layer",
                                         "model.n_head",
                                         "model.n_embd",
                                         "model.block_size",
                                         "model.dropout",
                                         "data.path",
                                         "data.val_fraction",
                                         "train.batch_size",
                                         "train.lr",
                                         "train.min_lr",
                                         "train.warmup_steps",
                                         "train.weight_decay",
                                         "train.grad_clip",
                                         "train.log_every",
                                         "train.eval_batches"};
  for (const std::string& key : keys) EXPECT_NE(pretrain_schema().find(key), nullptr) << key;
}

TEST_F(Pretrain, SemanticErrorsNameTheKeyAndWhereItWasSet) {
  EXPECT_EQ(resolve_error({"model.n_head=3"}),
            "command-line override 'model.n_head=3': model.n_head: 3 heads do not divide model.n_embd = 16");
  EXPECT_NE(resolve_error({"train.min_lr=0.5"}).find("train.min_lr: 0.5 must not exceed train.lr"), std::string::npos);
  EXPECT_NE(resolve_error({"device=gpu"}).find("device: invalid device 'gpu'"), std::string::npos);
  EXPECT_NE(resolve_error({"data.val_fraction=0"}).find("data.val_fraction: is 0"), std::string::npos);
  EXPECT_NE(resolve_error({"compile.memory_budget=0.4"}).find("compile.memory_budget: 0.4 recomputes activations in "
                                                               "a compiled step only"),
            std::string::npos);
  if (!cuda_available()) {
    EXPECT_NE(resolve_error({"device=cuda"}).find("device: 'cuda' asks for a GPU"), std::string::npos);
  }
}

TEST_F(Pretrain, LossFallsAndTheRunIsReproducible) {
  PretrainSettings s = resolve_pretrain(tiny());
  std::ostringstream log1, log2;
  TrainSummary a = run_pretrain(s, log1);
  TrainSummary b = run_pretrain(s, log2);
  EXPECT_EQ(a.steps, 12);
  EXPECT_LT(a.final_loss, a.first_loss - 0.5) << log1.str();
  EXPECT_LE(a.best_loss, a.final_loss);
  EXPECT_GT(a.val_loss.value_or(0), 0.0);
  EXPECT_EQ(a.first_loss, b.first_loss);
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_EQ(a.val_loss, b.val_loss);
  EXPECT_NE(log1.str().find("step 4/12 | loss "), std::string::npos) << log1.str();
  EXPECT_NE(log1.str().find("step 12/12 | loss "), std::string::npos) << log1.str();
}

TEST_F(Pretrain, SavesWeightsConfigAndSummaryInOutputDir) {
  std::ostringstream log;
  TrainSummary r = run_pretrain(resolve_pretrain(tiny({"max_steps=2"})), log);
  SafetensorsFile f = SafetensorsFile::open(dir_.file("out/model.safetensors"));
  EXPECT_TRUE(f.has("transformer.wte.weight"));
  EXPECT_EQ(f.info("transformer.wte.weight").shape, (Shape{256, 16}));
  nlohmann::json j = nlohmann::json::parse(read_file(dir_.file("out/summary.json")));
  EXPECT_EQ(j["steps"], 2);
  EXPECT_EQ(j["final_loss"].get<double>(), r.final_loss);
  EXPECT_EQ(j["checkpoints"][0], dir_.file("out/model.safetensors"));
  Config back = Config::load(dir_.file("out/config.yaml"));
  EXPECT_NO_THROW(back.validate(pretrain_schema()));
  EXPECT_EQ(back.get_int("max_steps"), 2);
}

TEST_F(Pretrain, Bf16TrainsWithF32MasterWeightsAndSavesF32) {
  std::ostringstream log;
  TrainSummary r = run_pretrain(resolve_pretrain(tiny({"dtype=bf16", "max_steps=6"})), log);
  EXPECT_EQ(r.dtype, "bf16");
  EXPECT_LT(r.final_loss, r.first_loss);
  SafetensorsFile f = SafetensorsFile::open(dir_.file("out/model.safetensors"));
  EXPECT_EQ(f.info("transformer.wte.weight").dtype, DType::f32);
}

// compile.enabled traces forward, backward, the device-side clip and AdamW into one graph; the losses follow
// the eager run (fused kernels round differently in the last bits, and the clip coefficient is computed on
// the device instead of the host).
TEST_F(Pretrain, CompiledStepFollowsTheEagerRunInOneGraph) {
  // The last case adds dropout: its masks are drawn at every compiled step as in eager (no graph break).
  for (const std::string extra : {"train.gradient_accumulation_steps=1", "train.gradient_accumulation_steps=2",
                                  "model.dropout=0.1"}) {
    SCOPED_TRACE(extra);
    const std::vector<std::string> common = {"train.grad_clip=0.5", extra};
    std::ostringstream elog, clog;
    TrainSummary e = run_pretrain(resolve_pretrain(tiny(common)), elog);
    std::vector<std::string> comp = common;
    comp.push_back("compile.enabled=true");
    comp.push_back("compile.cache_dir=" + dir_.file("cache"));
    TrainSummary c = run_pretrain(resolve_pretrain(tiny(comp)), clog);
    EXPECT_NEAR(c.first_loss, e.first_loss, 1e-5 * e.first_loss);
    EXPECT_NEAR(c.final_loss, e.final_loss, 1e-3 * e.final_loss) << clog.str();
    EXPECT_NEAR(c.val_loss.value_or(0), e.val_loss.value_or(-1), 1e-3 * e.val_loss.value_or(0));
    EXPECT_EQ(c.graphs, 1) << clog.str();
    EXPECT_EQ(c.graph_breaks, 0) << clog.str();
    EXPECT_EQ(c.recompiles, 0);
    EXPECT_GT(c.compile_s.value_or(0), 0.0);
    EXPECT_FALSE(e.compile_s.has_value());
    EXPECT_EQ(e.graphs, 0);
    EXPECT_NE(clog.str().find("compile | 1 graph(s), 0 break(s)"), std::string::npos) << clog.str();
    nlohmann::json j = nlohmann::json::parse(read_file(dir_.file("out/summary.json")));
    EXPECT_EQ(j["graphs"], 1);
  }
}

// Issue 24: under reduce-overhead the memory a replayed step holds includes its CUDA graphs' pool, which the allocator
// has back as free since the capture (Note [Pools held for CUDA graphs], runtime/pool_accounting.h); the progress
// line, metrics.jsonl and the summary print it. Before, a replayed 8B LoRA step printed 15.10 GiB of the 32 GiB it
// held. Activations outweigh the weights here (128 wide, 32 x 64 tokens), as there.
TEST_F(Pretrain, ReplayedCudaGraphStepsReportTheMemoryTheyHold) {
  INGOT_REQUIRE_CUDA();
  struct Run {
    std::map<int64_t, int64_t> peaks;  // metrics.jsonl's peak_memory_bytes by step
    TrainSummary summary;
    std::string log;
  };
  auto run = [&](const std::string& mode) {
    const std::string out = dir_.file("out-" + mode);
    std::ostringstream log;
    Run r;
    const Config c = tiny({"device=cuda", "max_steps=6", "train.log_every=1", "model.n_embd=128", "model.block_size=64",
                           "train.batch_size=32", "compile.enabled=true", "compile.mode=" + mode,
                           "compile.cache_dir=" + dir_.file("cache"), "output_dir=" + out});
    r.summary = run_pretrain(resolve_pretrain(c), log);
    std::ifstream in(out + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j["kind"] == "train") r.peaks[j["step"].get<int64_t>()] = j["peak_memory_bytes"].get<int64_t>();
    }
    r.log = log.str();
    return r;
  };
  const Run plain = run("default"), graphs = run("reduce-overhead");
  ASSERT_EQ(plain.peaks.size(), 6u) << plain.log;
  ASSERT_EQ(graphs.peaks.size(), 6u) << graphs.log;
  // Steps: 1 traces the step, 2 warms up, 3 captures the graphs, 4 to 6 replay them.
  int64_t most = 0;
  for (int64_t step = 1; step <= 6; ++step) most = std::max(most, graphs.peaks.at(step));
  for (int64_t step : {4, 5, 6}) {
    const int64_t peak = graphs.peaks.at(step);
    EXPECT_GE(peak, graphs.peaks.at(3)) << "step " << step << " holds what the captured step held\n" << graphs.log;
    EXPECT_GE(peak, plain.peaks.at(step)) << "step " << step << " holds at least the step without graphs\n"
                                          << plain.log << graphs.log;
    const std::string head = "step " + std::to_string(step) + "/6 | ";
    const size_t at = graphs.log.find(head);
    ASSERT_NE(at, std::string::npos) << graphs.log;
    const std::string line = graphs.log.substr(at, graphs.log.find('\n', at) - at);
    EXPECT_NE(line.find("mem peak " + format_bytes(static_cast<double>(peak))), std::string::npos)
        << line << "\nmetrics.jsonl: " << peak;
  }
  EXPECT_GE(graphs.summary.peak_memory_bytes, most);
  std::printf("[ peaks    ] step 5: default %s, reduce-overhead %s (captured step %s)\n",
              format_bytes(static_cast<double>(plain.peaks.at(5))).c_str(),
              format_bytes(static_cast<double>(graphs.peaks.at(5))).c_str(),
              format_bytes(static_cast<double>(graphs.peaks.at(3))).c_str());
}

TEST_F(Pretrain, SummaryWriteReplacesAnExistingFileWhole) {
  TrainSummary r;
  r.steps = 7;
  r.device = "cpu";
  std::ofstream(dir_.file("s.json")) << "old";
  write_summary(r, dir_.file("s.json"));
  nlohmann::json j = nlohmann::json::parse(read_file(dir_.file("s.json")));
  EXPECT_EQ(j["steps"], 7);
  for (const char* unmeasured : {"compile_s", "val_loss", "mfu", "tokens_per_s"})
    EXPECT_TRUE(j[unmeasured].is_null()) << unmeasured << " must be null, not a number, when not measured";
  EXPECT_EQ(j["recompiles"], 0);
}

}  // namespace
}  // namespace ingot::recipes
