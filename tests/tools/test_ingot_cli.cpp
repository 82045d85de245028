// End-to-end tests of the `ingot` program: they run the built binary (bin/ingot beside bin/ingot_tests) on a
// tiny config and text in a temporary directory.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "recipes/train.h"
#include "runtime/file_util.h"
#include "tests/shell.h"

namespace ingot {
namespace {

namespace fs = std::filesystem;

using Result = ingot::testing::ShellResult;  // stdout and stderr together

fs::path ingot_binary() { return fs::read_symlink("/proc/self/exe").parent_path() / "ingot"; }

// Runs `ingot <args>` in `cwd` through the shell; args are passed as written (tests quote them).
Result run_ingot(const std::string& cwd, const std::string& args) {
  return ingot::testing::run_shell("cd '" + cwd + "' && '" + ingot_binary().string() + "' " + args + " 2>&1");
}

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const char* kTinyConfig = R"(device: cpu
max_steps: 3
seed: 5
output_dir: out
model:
  n_layer: 1
  n_head: 2
  n_embd: 16
  block_size: 8
data:
  path: text.txt
  val_fraction: 0.2
train:
  batch_size: 4
  lr: 1.0e-2
  warmup_steps: 1
  log_every: 1
  eval_batches: 2
)";

class IngotCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(ingot_binary())) << ingot_binary() << " is missing: build the `ingot` target too";
    std::string text;
    for (int i = 0; i < 20; ++i) text += "In the beginning God created the heaven and the earth.\n";
    write(dir_.file("text.txt"), text);
    write(dir_.file("tiny.yaml"), kTinyConfig);
  }
  TempDir dir_{"ingot_cli_test"};
};

TEST_F(IngotCli, RunTrainsAndWritesTheSummaryWeightsAndResolvedConfig) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml --summary sub/summary.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 1/3 | loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 3/3 | loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" tok/s | mem "), std::string::npos) << r.output;  // no MFU on a CPU by default
  EXPECT_NE(r.output.find(" | ETA "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("eval | val_loss "), std::string::npos) << r.output;

  nlohmann::json j = nlohmann::json::parse(slurp(dir_.file("sub/summary.json")));
  for (const char* key :
       {"first_loss", "final_loss", "best_loss", "val_loss", "steps", "tokens_per_s", "compile_s", "graphs",
        "graph_breaks", "recompiles", "peak_memory_bytes", "device", "dtype", "output_dir", "checkpoints"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["steps"], 3);
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["dtype"], "f32");
  EXPECT_EQ(j["graphs"], 0);
  EXPECT_GT(j["first_loss"].get<double>(), 4.0);  // about ln(256) = 5.5 at initialization
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["peak_memory_bytes"].get<int64_t>(), 0);
  EXPECT_TRUE(fs::exists(dir_.file("out/model.safetensors")));
  EXPECT_TRUE(fs::exists(dir_.file("out/summary.json")));
  EXPECT_NE(slurp(dir_.file("out/config.yaml")).find("n_embd: 16"), std::string::npos);
}

TEST_F(IngotCli, OverridesChangeTheRun) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml max_steps=2 train.log_every=2 --summary=s.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(slurp(dir_.file("s.json")))["steps"], 2);
  EXPECT_NE(r.output.find("step 2/2 | loss "), std::string::npos) << r.output;
}

TEST_F(IngotCli, BadConfigExitsWithTwoNamesFileLineAndKeyAndWritesNothing) {
  write(dir_.file("summary.json"), "previous summary");
  write(dir_.file("bad.yaml"), std::string(kTinyConfig) + "  lrr: 0.1\n");
  Result r = run_ingot(dir_.path(), "run bad.yaml --summary summary.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("bad.yaml:19:3: unknown key 'train.lrr'; did you mean 'train.lr'?"), std::string::npos)
      << r.output;
  EXPECT_EQ(slurp(dir_.file("summary.json")), "previous summary");
  EXPECT_FALSE(fs::exists(dir_.file("out")));
}

TEST_F(IngotCli, BadOverrideValueIsNamed) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml train.batch_size=lots");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("command-line override 'train.batch_size=lots': train.batch_size: expected an integer"),
            std::string::npos)
      << r.output;
}

TEST_F(IngotCli, MissingConfigOrDataFileIsNamed) {
  Result r = run_ingot(dir_.path(), "run nope.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("nope.yaml: cannot open config file"), std::string::npos) << r.output;

  r = run_ingot(dir_.path(), "run tiny.yaml data.path=missing.txt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("data.path: no such file 'missing.txt'"), std::string::npos) << r.output;
}

// `ingot explain` runs two real steps into a scratch directory and prints the compiler's report on stdout; the
// config's own output_dir stays untouched.
TEST_F(IngotCli, ExplainReportsTheCompiledStepWithoutWritingTheRunsOutputDir) {
  // stdout alone into report.txt (run_ingot appends 2>&1, which here applies to `exit`).
  Result r = run_ingot(dir_.path(), "explain tiny.yaml compile.cache_dir=" + dir_.file("cache") +
                                        " > report.txt 2> log.txt; exit $?");
  ASSERT_EQ(r.exit_code, 0) << slurp(dir_.file("log.txt"));
  EXPECT_NE(slurp(dir_.file("log.txt")).find("step 2/2 | loss "), std::string::npos) << "the training log";
  r.output = slurp(dir_.file("report.txt"));
  EXPECT_NE(r.output.find("compiled function 'train_step'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("graphs: 1 (the whole step is one graph)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("graph breaks: 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launches per call (eager: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("calls: 2 (1 compiled, 0 eager)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 1/2"), std::string::npos) << "the report alone is on stdout";
  EXPECT_FALSE(fs::exists(dir_.file("out"))) << "explain writes into a scratch directory only";

  r = run_ingot(dir_.path(), "explain tiny.yaml --steps 0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--steps: expected a positive integer, got '0'"), std::string::npos) << r.output;
  r = run_ingot(dir_.path(), "explain tiny.yaml train.lr=fast");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train.lr"), std::string::npos) << r.output;
  // A valid config of a recipe without a training step (the built-in eval config, run from the source tree
  // where its fixture paths resolve).
  r = run_ingot(INGOT_SOURCE_DIR, "explain eval_perplexity");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("recipe 'eval' has no training step to compile"), std::string::npos) << r.output;
}

TEST_F(IngotCli, ResumeWithoutACheckpointIsAnErrorNamingTheKey) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml resume=true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("resume: true, but there is no checkpoint"), std::string::npos) << r.output;
}

TEST_F(IngotCli, CompileEnabledCompilesTheStepIntoOneGraphAndReportsIt) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml compile.enabled=true compile.mode=max-autotune max_steps=2 "
                                    "compile.cache_dir=" + dir_.file("cache"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("compile | mode max-autotune"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("compile | 1 graph(s), 0 break(s), 0 recompile(s)"), std::string::npos) << r.output;
  r = run_ingot(dir_.path(), "run tiny.yaml compile.mode=fastest");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("compile.mode: expected one of default, reduce-overhead, max-autotune"), std::string::npos)
      << r.output;
}

TEST_F(IngotCli, UnreadableTextIsARuntimeErrorWithExitOne) {
  write(dir_.file("text.txt"), std::string("caf\xe9 latin-1, not UTF-8\n", 24));
  Result r = run_ingot(dir_.path(), "run tiny.yaml --summary s.json");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("text.txt: not UTF-8 text"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("s.json")));
}

TEST_F(IngotCli, UsageErrorsExitWithTwo) {
  for (const char* args :
       {"", "frobnicate", "run", "run tiny.yaml --bogus", "run tiny.yaml stray", "run tiny.yaml --summary"}) {
    Result r = run_ingot(dir_.path(), args);
    EXPECT_EQ(r.exit_code, 2) << "ingot " << args << ": " << r.output;
    EXPECT_NE(r.output.find("--help"), std::string::npos) << r.output;
  }
}

TEST_F(IngotCli, HelpAndVersion) {
  Result r = run_ingot(dir_.path(), "--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("ingot run CONFIG [key=value ...] [~key ...] [--summary PATH]"), std::string::npos) << r.output;

  r = run_ingot(dir_.path(), "run --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const recipes::ConfigKey& k : recipes::pretrain_schema().keys())
    EXPECT_NE(r.output.find("  " + k.path + " "), std::string::npos) << k.path << " missing from run --help";

  r = run_ingot(dir_.path(), "--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output.rfind("ingot ", 0), 0u) << r.output;
}

TEST_F(IngotCli, ValidateReportsEveryErrorAtOnceWithFileLineColumnAndKey) {
  write(dir_.file("bad.yaml"), R"(device: cpu
max_steps: 0
output_dir: out
model:
  n_layer: many
  n_head: 2
  n_embd: 16
data:
  path: missing.txt
train:
  lrr: 0.1
)");
  Result r = run_ingot(dir_.path(), "validate bad.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("4 config errors:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad.yaml:2:12: max_steps: expected an integer >= 1, got '0'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad.yaml:5:12: model.n_layer: expected an integer, got 'many'"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("bad.yaml:9:9: data.path: no such file 'missing.txt'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad.yaml:11:3: unknown key 'train.lrr'; did you mean 'train.lr'?"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("out")));

  r = run_ingot(dir_.path(), "validate tiny.yaml");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tiny.yaml: valid pretrain config"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("out"))) << "validate must not run anything";
}

TEST_F(IngotCli, RemovingAKeyRestoresItsDefaultAndAnAbsentKeyIsNamed) {
  write(dir_.file("bad.yaml"), std::string(kTinyConfig) + "  lrr: 0.1\n");
  Result r = run_ingot(dir_.path(), "validate bad.yaml ~train.lrr");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run_ingot(dir_.path(), "validate tiny.yaml ~train.nope");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'~train.nope': the config does not set 'train.nope'"), std::string::npos) << r.output;
  r = run_ingot(dir_.path(), "validate tiny.yaml recipe=pretrian");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown recipe 'pretrian'; did you mean 'pretrain'?"), std::string::npos) << r.output;
}

TEST_F(IngotCli, LsCatAndCpFindTheBuiltInConfigsOfTheSourceTree) {
  Result r = run_ingot(dir_.path(), "ls");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pretrain  train a GPT-2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("    quickstart "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("    gpt2_124m_pretrain "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(std::string(INGOT_SOURCE_DIR) + "/configs"), std::string::npos) << r.output;

  const std::string quickstart = slurp(std::string(INGOT_SOURCE_DIR) + "/configs/quickstart.yaml");
  r = run_ingot(dir_.path(), "cat quickstart");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, quickstart);

  r = run_ingot(dir_.path(), "cp quickstart.yaml mine.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(slurp(dir_.file("mine.yaml")), quickstart);
  write(dir_.file("mine.yaml"), "edited");
  r = run_ingot(dir_.path(), "cp quickstart mine.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("exists; pass --force"), std::string::npos) << r.output;
  EXPECT_EQ(slurp(dir_.file("mine.yaml")), "edited");
  r = run_ingot(dir_.path(), "cp --force quickstart mine.yaml");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(slurp(dir_.file("mine.yaml")), quickstart);

  r = run_ingot(dir_.path(), "cat quikstart");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no such file, built-in config or recipe"), std::string::npos) << r.output;
}

TEST_F(IngotCli, ConfigPathEnvironmentAddsDirectoriesSearchedFirst) {
  fs::create_directories(dir_.file("extra"));
  write(dir_.file("extra/quickstart.yaml"), "# my own quickstart\nmax_steps: 1\n");
  const Result r = ingot::testing::run_shell("cd '" + dir_.path() + "' && INGOT_CONFIG_PATH='" + dir_.file("extra") +
                                            "' '" + ingot_binary().string() + "' ls 2>&1");
  const std::string& out = r.output;
  EXPECT_EQ(r.exit_code, 0) << out;
  EXPECT_NE(out.find("my own quickstart"), std::string::npos) << out;
  EXPECT_EQ(out.find("Quickstart: a small GPT-2"), std::string::npos) << "the earlier directory wins: " << out;
}

TEST_F(IngotCli, PlotDrawsARunDirectorysMetricsAndNamesAMissingOne) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml logging.plot=false");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("out/loss.png")));
  r = run_ingot(dir_.path(), "plot out");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(slurp(dir_.file("out/loss.png")).substr(1, 3), "PNG");
  r = run_ingot(dir_.path(), "plot nowhere");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("nowhere/metrics.jsonl' does not exist"), std::string::npos) << r.output;
}

TEST_F(IngotCli, EveryCommandHasHelp) {
  for (const char* cmd : {"run", "ls", "cat", "cp", "validate", "plot"}) {
    Result r = run_ingot(dir_.path(), std::string(cmd) + " --help");
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
    EXPECT_EQ(r.output.rfind(std::string("Usage: ingot ") + cmd, 0), 0u) << r.output;
  }
}

TEST_F(IngotCli, ResumeTrueContinuesAfterTheNewestCheckpoint) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml max_steps=4 checkpoint.save_every=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_ingot(dir_.path(), "run tiny.yaml max_steps=4 checkpoint.save_every=2 resume=true --summary s.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resume | resume: true: continuing after step 4"), std::string::npos) << r.output;
  nlohmann::json j = nlohmann::json::parse(slurp(dir_.file("s.json")));
  EXPECT_EQ(j["resumed_from_step"], 4);
  EXPECT_EQ(j["steps"], 4);
}

}  // namespace
}  // namespace ingot
