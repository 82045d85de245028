// End-to-end tests of the `ingot` program: they run the built binary (bin/ingot beside bin/ingot_tests) on a
// tiny config and text in a temporary directory.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
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
  EXPECT_NE(r.output.find("calls: 2 (1 traced while compiling, 1 compiled, 0 eager)"), std::string::npos) << r.output;
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

TEST_F(IngotCli, ResumeTrueWithoutACheckpointStartsFreshWithANote) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml resume=true max_steps=2 --summary s.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resume | resume: true, but out/checkpoints holds no checkpoint yet: starting fresh"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(nlohmann::json::parse(slurp(dir_.file("s.json")))["resumed_from_step"], 0);
}

TEST_F(IngotCli, AFreshRunIntoAnOutputDirWithCheckpointsRefusesNamingThemAndKeepsThem) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml max_steps=4 checkpoint.save_every=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string weights = slurp(dir_.file("out/model.safetensors"));
  r = run_ingot(dir_.path(), "run tiny.yaml max_steps=1 checkpoint.save_every=1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const char* part : {"tiny.yaml:4:13: output_dir: 'out' holds checkpoints of an earlier run (step_00000002, "
                           "step_00000004 in out/checkpoints)",
                           "resume=true", "overwrite_output_dir=true", "new output_dir"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  EXPECT_TRUE(fs::exists(dir_.file("out/checkpoints/step_00000002/manifest.json")));
  EXPECT_TRUE(fs::exists(dir_.file("out/checkpoints/step_00000004/manifest.json")));
  EXPECT_EQ(slurp(dir_.file("out/model.safetensors")), weights);
  // validate says the same before anything runs.
  r = run_ingot(dir_.path(), "validate tiny.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("holds checkpoints of an earlier run"), std::string::npos) << r.output;
}

TEST_F(IngotCli, OverwriteOutputDirReplacesAnEarlierRunsCheckpointsAndNamesEachOne) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml max_steps=4 checkpoint.save_every=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_ingot(dir_.path(), "run tiny.yaml max_steps=1 checkpoint.save_every=1 overwrite_output_dir=true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoint | removed out/checkpoints/step_00000004 (an earlier run's"), std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(dir_.file("out/checkpoints/step_00000001/manifest.json")));
  EXPECT_FALSE(fs::exists(dir_.file("out/checkpoints/step_00000002")));
  EXPECT_FALSE(fs::exists(dir_.file("out/checkpoints/step_00000004")));
}

TEST_F(IngotCli, OverwriteOutputDirWithoutCheckpointingRemovesTheEarlierOnesAtTheEnd) {
  ASSERT_EQ(run_ingot(dir_.path(), "run tiny.yaml max_steps=2 checkpoint.save_every=2").exit_code, 0);
  Result r = run_ingot(dir_.path(), "run tiny.yaml max_steps=1 overwrite_output_dir=true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoint | removed out/checkpoints/step_00000002"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("out/checkpoints/step_00000002")));
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

TEST_F(IngotCli, TextThatIsNotUtf8IsAConfigErrorThatValidateFindsToo) {
  write(dir_.file("text.txt"), std::string("caf\xe9 latin-1, not UTF-8\n", 24));
  const std::string expected =
      "tiny.yaml:11:9: data.path: 'text.txt' is not UTF-8 text (invalid byte 0xe9 at byte offset 3, line 1)";
  Result r = run_ingot(dir_.path(), "run tiny.yaml --summary s.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("s.json")));
  EXPECT_FALSE(fs::exists(dir_.file("out")));
  r = run_ingot(dir_.path(), "validate tiny.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
}

TEST_F(IngotCli, ValidateReportsAnEmptyDataFileAndUnwritableOutputsAtOnceAsRunWould) {
  write(dir_.file("text.txt"), "");
  write(dir_.file("blocker"), "a file where a directory would go\n");
  const std::string args = "tiny.yaml output_dir=blocker/out --summary blocker/s.json";
  for (const char* cmd : {"validate ", "run "}) {
    Result r = run_ingot(dir_.path(), cmd + args);
    EXPECT_EQ(r.exit_code, 2) << cmd << r.output;
    if (std::string(cmd) == "validate ") {  // run stops at the --summary path before reading the config
      EXPECT_NE(r.output.find("data.path: 'text.txt' is empty"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("output_dir: 'blocker/out' cannot be created: '" + dir_.file("blocker") +
                              "' is not a directory"),
                std::string::npos)
          << r.output;
    }
    EXPECT_NE(r.output.find("--summary: 'blocker/s.json' cannot be created"), std::string::npos) << r.output;
  }
  // A checkpoints/ that cannot be a directory is found before step 1, not at the first save.
  write(dir_.file("text.txt"), "In the beginning God created the heaven and the earth.\n");
  fs::create_directory(dir_.file("out"));
  write(dir_.file("out/checkpoints"), "not a directory\n");
  Result r = run_ingot(dir_.path(), "run tiny.yaml checkpoint.save_every=2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("output_dir: 'out/checkpoints' exists and is not a directory"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
  EXPECT_EQ(run_ingot(dir_.path(), "validate tiny.yaml").exit_code, 0) << "no checkpoints are saved by default";
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

TEST_F(IngotCli, EveryCommandHasHelpNamingEachOfItsOptions) {
  const std::map<std::string, std::vector<std::string>> options = {
      {"run", {"CONFIG", "key=value|~key", "--summary PATH", "-h,--help"}},
      {"ls", {"-h,--help"}},
      {"cat", {"CONFIG", "-h,--help"}},
      {"cp", {"CONFIG PATH", "-f,--force", "-h,--help"}},
      {"validate", {"CONFIG", "key=value|~key", "--summary PATH", "-h,--help"}},
      {"explain", {"CONFIG", "key=value|~key", "--steps N", "-h,--help"}},
      {"plot", {"RUN_DIR", "--out PATH", "-h,--help"}},
  };
  Result main_help = run_ingot(dir_.path(), "--help");
  for (const auto& [cmd, opts] : options) {
    EXPECT_NE(main_help.output.find("  ingot " + cmd), std::string::npos) << cmd << " missing from --help";
    for (const std::string& help : {std::string("--help"), std::string("-h")}) {
      Result r = run_ingot(dir_.path(), cmd + " " + help);
      EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
      EXPECT_EQ(r.output.rfind("Usage: ingot " + cmd, 0), 0u) << r.output;
      for (const std::string& o : opts)
        EXPECT_NE(r.output.find("  " + o + " "), std::string::npos) << cmd << ": " << o << "\n" << r.output;
    }
  }
  EXPECT_NE(main_help.output.find("  ingot launch [options] -- COMMAND [ARGS ...]"), std::string::npos);
  Result r = run_ingot(dir_.path(), "launch --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--nproc-per-node"), std::string::npos) << "torchrun's spellings stay: " << r.output;
}

TEST_F(IngotCli, OptionsTakeBothSpellingsAndArgumentsNamedLikeCommandsStayArguments) {
  ASSERT_EQ(run_ingot(dir_.path(), "run tiny.yaml max_steps=1 --summary=a.json").exit_code, 0);
  ASSERT_EQ(run_ingot(dir_.path(), "run --summary b.json tiny.yaml max_steps=1 ~train.warmup_steps").exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(slurp(dir_.file("a.json")))["steps"], 1);
  EXPECT_EQ(nlohmann::json::parse(slurp(dir_.file("b.json")))["steps"], 1);
  // `cp CONFIG run`: a file called run, not the run command.
  Result r = run_ingot(dir_.path(), "cp tiny.yaml run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(slurp(dir_.file("run")), kTinyConfig);
  r = run_ingot(dir_.path(), "cp tiny.yaml run");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(run_ingot(dir_.path(), "cp -f tiny.yaml run").exit_code, 0);
  r = run_ingot(dir_.path(), "cat tiny.yaml extra");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("Try 'ingot cat --help'."), std::string::npos) << r.output;
}

TEST_F(IngotCli, PlotOverlaysSeveralRunsAndDrawsTheLearningRate) {
  ASSERT_EQ(run_ingot(dir_.path(), "run tiny.yaml max_steps=3 output_dir=a").exit_code, 0);
  ASSERT_EQ(run_ingot(dir_.path(), "run tiny.yaml max_steps=4 output_dir=b train.lr=3e-3").exit_code, 0);
  Result r = run_ingot(dir_.path(), "plot a b --out both.png");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote both.png"), std::string::npos) << r.output;
  EXPECT_EQ(slurp(dir_.file("both.png")).substr(1, 3), "PNG");
  r = run_ingot(dir_.path(), "plot a b");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("several RUN_DIRs are drawn into one figure: say where with --out PATH"), std::string::npos)
      << r.output;
  r = run_ingot(dir_.path(), "plot a nowhere --out x.png");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("nowhere/metrics.jsonl' does not exist"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("x.png")));
}

TEST_F(IngotCli, AValidationSplitShorterThanOneBlockIsFoundByValidateNamingTheKeyAndFile) {
  // text.txt has 1100 bytes: 0.005 of them (6) cannot fill a window of block_size + 1 = 9 tokens.
  for (const char* cmd : {"validate", "run"}) {
    Result r = run_ingot(dir_.path(), std::string(cmd) + " tiny.yaml data.val_fraction=0.005");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("data.val_fraction: 0.005 of 'text.txt' (1100 tokens (bytes)) leaves a validation split "
                            "of 6 tokens, fewer than model.block_size + 1 = 9"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
  }
  EXPECT_FALSE(fs::exists(dir_.file("out")));
  EXPECT_EQ(run_ingot(dir_.path(), "validate tiny.yaml data.val_fraction=0.005 train.eval_batches=0").exit_code, 0);
  Result r = run_ingot(dir_.path(), "validate tiny.yaml model.block_size=1000");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("data.path: 'text.txt' (1100 tokens (bytes)) leaves a train split of 880 tokens, fewer than "
                          "model.block_size + 1 = 1001"),
            std::string::npos)
      << r.output;
}

TEST_F(IngotCli, OptimizersAreChosenInTheConfigAndTheirKeysChecked) {
  for (const char* opt : {"optimizer.name=sgd optimizer.momentum=0.9 optimizer.nesterov=true train.lr=0.1",
                          "optimizer.name=lion train.lr=1e-3"}) {
    Result r = run_ingot(dir_.path(),
                         std::string("run tiny.yaml max_steps=3 overwrite_output_dir=true --summary s.json ") + opt);
    ASSERT_EQ(r.exit_code, 0) << opt << "\n" << r.output;
    nlohmann::json s = nlohmann::json::parse(slurp(dir_.file("s.json")));
    EXPECT_LT(s["final_loss"].get<double>(), s["first_loss"].get<double>()) << opt;
  }
  Result r = run_ingot(dir_.path(), "validate tiny.yaml optimizer.momentum=0.5 optimizer.name=lian");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.name: expected one of adamw, adamw8bit, sgd, lion, got 'lian'; did you mean "
                          "'lion'?"),
            std::string::npos)
      << r.output;
  r = run_ingot(dir_.path(), "validate tiny.yaml optimizer.momentum=0.5");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.momentum: is read by optimizer.name: sgd only, and optimizer.name is adamw"),
            std::string::npos)
      << r.output;
  r = run_ingot(dir_.path(), "validate tiny.yaml optimizer.name=sgd optimizer.momentum=0 optimizer.nesterov=true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.nesterov: true needs optimizer.momentum > 0 (it is 0)"), std::string::npos)
      << r.output;
}

TEST_F(IngotCli, F16TrainsWithDynamicLossScalingAndSkipsOverflowingSteps) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml dtype=f16 max_steps=4 checkpoint.save_every=2 --summary s.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json s = nlohmann::json::parse(slurp(dir_.file("s.json")));
  EXPECT_EQ(s["dtype"], "f16");
  EXPECT_LT(s["final_loss"].get<double>(), s["first_loss"].get<double>()) << r.output;
  EXPECT_NE(slurp(dir_.file("out/checkpoints/step_00000004/state.json")).find("\"loss_scale\""), std::string::npos);
  // A first scale of 1e30 overflows the gradients: each step is skipped and the scale halves.
  r = run_ingot(dir_.path(), "run tiny.yaml dtype=f16 max_steps=2 output_dir=big train.init_loss_scale=1e30 "
                             "--summary big.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"f16 | step 1: the gradients overflowed at loss scale 1e+30, so the update is skipped and "
                           "the scale is now 5e+29",
                           "f16 | step 2: the gradients overflowed at loss scale 5e+29"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  r = run_ingot(dir_.path(), "validate tiny.yaml train.init_loss_scale=1024");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train.init_loss_scale: is read with dtype: f16 only, and dtype is f32"), std::string::npos)
      << r.output;
  r = run_ingot(dir_.path(), "validate tiny.yaml dtype=f16 compile.enabled=true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("dtype: f16 trains with dynamic loss scaling"), std::string::npos) << r.output;
}

TEST_F(IngotCli, LionAndSgdShardUnderZeroTwoAndTrainLikeOneProcess) {
  for (const char* opt : {"optimizer.name=lion train.lr=1e-3", "optimizer.name=sgd train.lr=0.1"}) {
    const std::string run = std::string("run tiny.yaml max_steps=4 train.eval_batches=0 ") + opt;
    Result r = run_ingot(dir_.path(), run + " output_dir=one --summary one.json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_ingot(dir_.path(), "launch --nproc-per-node 2 -- '" + ingot_binary().string() + "' " + run +
                                   " output_dir=two distributed.zero_stage=2 --summary two.json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NEAR(nlohmann::json::parse(slurp(dir_.file("two.json")))["final_loss"].get<double>(),
                nlohmann::json::parse(slurp(dir_.file("one.json")))["final_loss"].get<double>(), 1e-5)
        << opt;
  }
}

TEST_F(IngotCli, ACompiledLionStepTrainsLikeTheEagerOne) {
  double final_loss[2];
  for (int compiled = 0; compiled < 2; ++compiled) {
    Result r = run_ingot(dir_.path(), "run tiny.yaml optimizer.name=lion train.lr=1e-3 max_steps=3 "
                                      "overwrite_output_dir=true --summary s.json compile.enabled=" +
                                          std::string(compiled ? "true" : "false"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    nlohmann::json s = nlohmann::json::parse(slurp(dir_.file("s.json")));
    final_loss[compiled] = s["final_loss"].get<double>();
    EXPECT_EQ(s["graphs"], compiled) << r.output;
  }
  EXPECT_NEAR(final_loss[1], final_loss[0], 1e-4);
}

TEST_F(IngotCli, AdamW8bitIsChosenInTheConfigNamedInTheBannerAndCompiles) {
  double final_loss[2];
  for (int compiled = 0; compiled < 2; ++compiled) {
    Result r = run_ingot(dir_.path(), "run tiny.yaml optimizer.name=adamw8bit max_steps=4 overwrite_output_dir=true "
                                      "--summary s.json compile.enabled=" +
                                          std::string(compiled ? "true" : "false"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // tiny.yaml's token embedding (256 x 16) is the one tensor of >= 4096 elements.
    EXPECT_NE(r.output.find("optimizer | adamw8bit: 8-bit moments for 1 of "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("(f32 AdamW: "), std::string::npos) << r.output;
    nlohmann::json s = nlohmann::json::parse(slurp(dir_.file("s.json")));
    EXPECT_LT(s["final_loss"].get<double>(), s["first_loss"].get<double>()) << r.output;
    final_loss[compiled] = s["final_loss"].get<double>();
    EXPECT_EQ(s["graphs"], compiled) << r.output;
  }
  EXPECT_NEAR(final_loss[1], final_loss[0], 1e-4);
  Result r = run_ingot(dir_.path(), "run tiny.yaml max_steps=1 overwrite_output_dir=true");
  EXPECT_NE(r.output.find("optimizer | adamw | state "), std::string::npos) << r.output;
  r = run_ingot(dir_.path(), "validate tiny.yaml optimizer.name=adam8bit");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.name: expected one of adamw, adamw8bit, sgd, lion, got 'adam8bit'; did you mean "
                          "'adamw8bit'?"),
            std::string::npos)
      << r.output;
  // Under ZeRO too (tests/recipes/test_distributed_run.cpp: Bf16WeightsWithoutMastersShardUnderZeroOneTwoAndThree...).
  EXPECT_EQ(run_ingot(dir_.path(), "validate tiny.yaml optimizer.name=adamw8bit distributed.zero_stage=2").exit_code, 0);
  EXPECT_EQ(run_ingot(dir_.path(), "validate tiny.yaml optimizer.name=adamw8bit").exit_code, 0);
  r = run_ingot(dir_.path(), "run --help");
  EXPECT_NE(r.output.find("adamw8bit (AdamW with its moments in 8 bits"), std::string::npos) << r.output;
}

TEST_F(IngotCli, AdamW8bitUnderDataParallelTrainsLikeOneProcess) {
  // Plain DDP: every rank holds the whole 8-bit state and applies the same averaged gradients.
  const std::string run = "run tiny.yaml max_steps=4 train.eval_batches=0 optimizer.name=adamw8bit";
  Result r = run_ingot(dir_.path(), run + " output_dir=one --summary one.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_ingot(dir_.path(), "launch --nproc-per-node 2 -- '" + ingot_binary().string() + "' " + run +
                                 " output_dir=two --summary two.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NEAR(nlohmann::json::parse(slurp(dir_.file("two.json")))["final_loss"].get<double>(),
              nlohmann::json::parse(slurp(dir_.file("one.json")))["final_loss"].get<double>(), 1e-5);
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

TEST(SetupScript, BuildsTheProgramFirstAndTheTestsOnlyWhenAsked) {
  const std::string script = std::string(INGOT_SOURCE_DIR) + "/scripts/setup.sh";
  Result r = ingot::testing::run_shell("bash '" + script + "' --bogus 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("setup: unknown argument '--bogus' (expected --tests)"), std::string::npos) << r.output;
  r = ingot::testing::run_shell("bash '" + script + "' --help 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("scripts/setup.sh [--tests]"), std::string::npos) << r.output;
  // The program's target is built before (and without) the rest.
  const std::string text = slurp(script);
  const size_t program = text.find("timed_build --target ingot\n");
  const size_t rest = text.find("if ((all_targets)); then\n  echo \"setup: building the tests");
  ASSERT_NE(program, std::string::npos);
  ASSERT_NE(rest, std::string::npos);
  EXPECT_LT(program, rest);
  // README's test command asks for the rest, and CI (.ci/run) runs that command verbatim: a CI that kept the
  // old command ran ctest on a build holding only the ingot program.
  const std::string readme = slurp(std::string(INGOT_SOURCE_DIR) + "/README.md");
  const std::string command = "./scripts/setup.sh --tests && ctest --test-dir build --output-on-failure -j\"$(nproc)\"";
  EXPECT_NE(readme.find("\n" + command + "\n"), std::string::npos) << "README's test command changed";
  EXPECT_NE(slurp(std::string(INGOT_SOURCE_DIR) + "/.ci/run").find("\n" + command + "\n"), std::string::npos)
      << ".ci/run must run README's test command";
}

// The learning rates metrics.jsonl recorded, by step.
std::map<int64_t, double> logged_lrs(const std::string& metrics) {
  std::map<int64_t, double> out;
  std::istringstream in(slurp(metrics));
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["kind"] == "train") out[j["step"].get<int64_t>()] = j["lr"].get<double>();
  }
  return out;
}

TEST_F(IngotCli, NumbersAreMeasuredOrNullAndSayWhatTheyCount) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml max_steps=1 train.eval_batches=0 checkpoint.save_every=1 "
                                    "--summary s.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("done | 1 step in "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" | gnorm "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" | mem peak "), std::string::npos) << r.output;
  nlohmann::json s = nlohmann::json::parse(slurp(dir_.file("s.json")));
  EXPECT_TRUE(s["val_loss"].is_null()) << s;  // no eval
  EXPECT_TRUE(s["mfu"].is_null()) << s;       // no known peak on a CPU
  EXPECT_GT(s["tokens_per_s"].get<double>(), 0);
  nlohmann::json rec = nlohmann::json::parse(slurp(dir_.file("out/metrics.jsonl")));
  EXPECT_TRUE(rec["mfu"].is_null()) << rec;
  EXPECT_GT(rec["grad_norm"].get<double>(), 0) << rec;
  EXPECT_GT(rec["peak_memory_bytes"].get<int64_t>(), 0) << rec;
  EXPECT_LE(rec["peak_memory_bytes"].get<int64_t>(), s["peak_memory_bytes"].get<int64_t>());

  r = run_ingot(dir_.path(), "run tiny.yaml max_steps=3 checkpoint.save_every=1 resume=true resume_schedule=stretch");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("done | steps 2-3 in "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(3 steps in "), std::string::npos) << r.output;
  r = run_ingot(dir_.path(), "run tiny.yaml max_steps=3 checkpoint.save_every=1 resume=true --summary s.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("done | no step left to train (3 steps in "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" | - tok/s | "), std::string::npos) << r.output;
  EXPECT_TRUE(nlohmann::json::parse(slurp(dir_.file("s.json")))["tokens_per_s"].is_null());
}

TEST_F(IngotCli, TheFirstEtaOfACompiledRunDoesNotCountTheCompile) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml compile.enabled=true max_steps=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 1/3 | loss "), std::string::npos) << r.output;
  const std::string first = r.output.substr(r.output.find("step 1/3 | loss "));
  EXPECT_EQ(first.substr(0, first.find('\n')).substr(first.find(" | ETA ")), " | ETA -") << r.output;
  EXPECT_NE(r.output.find(" | gnorm "), std::string::npos) << "tiny.yaml clips, so the compiled step reports it";
}

TEST_F(IngotCli, TheBannerNamesTheConfigFileAndWhereTheRunWrites) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml max_steps=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("config | tiny.yaml | output_dir " + dir_.file("out") + "\n"), std::string::npos)
      << r.output;
  r = run_ingot(dir_.path(), "run quickstart max_steps=1 data.path=text.txt model.block_size=8 output_dir=q");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("configs/quickstart.yaml (built-in config 'quickstart') | output_dir " + dir_.file("q")),
            std::string::npos)
      << r.output;
}

TEST_F(IngotCli, AMemoryBudgetWithoutCompileIsAConfigErrorNotASilentNoOp) {
  Result r = run_ingot(dir_.path(), "run tiny.yaml compile.memory_budget=0.5");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("compile.memory_budget: 0.5 recomputes activations in a compiled step only, and "
                          "compile.enabled is false"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(run_ingot(dir_.path(), "validate tiny.yaml compile.memory_budget=0.5 compile.enabled=true").exit_code, 0);
}

TEST_F(IngotCli, ANegativeUnitReductionLagIsAConfigError) {
  Result r = run_ingot(dir_.path(), "validate tiny.yaml compile.unit_reduction_lag=-1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("compile.unit_reduction_lag: expected an integer >= 0, got '-1'"), std::string::npos)
      << r.output;
  EXPECT_EQ(run_ingot(dir_.path(), "validate tiny.yaml compile.unit_reduction_lag=0").exit_code, 0);
}

TEST_F(IngotCli, MessagesShowTheValueAndSuggestWhatWasMeant) {
  Result r = run_ingot(dir_.path(), "validate tiny.yaml train.lr=1e-4 train.min_lr=3e-4 train.learning_rate=1e-3 "
                                    "dtype=bfloat16");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const char* part : {"train.min_lr: 3e-4 must not exceed train.lr (1e-4)",
                           "unknown key 'train.learning_rate'; did you mean 'train.lr'? (`ingot run pretrain --help` "
                           "lists every key)",
                           "dtype: expected one of f32, bf16, f16, got 'bfloat16'; did you mean 'bf16'?"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  r = run_ingot(dir_.path(), "rn tiny.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ingot: unknown command 'rn'; did you mean 'run'?"), std::string::npos) << r.output;
  r = run_ingot(dir_.path(), "cat quickstrt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("quickstrt: cannot open config file: no such file, built-in config or recipe; did you mean "
                          "'quickstart'?"),
            std::string::npos)
      << r.output;
}

TEST_F(IngotCli, ResumingWithAnotherMaxStepsRefusesNamingTheLearningRateJump) {
  ASSERT_EQ(run_ingot(dir_.path(), "run tiny.yaml max_steps=4 checkpoint.save_every=2").exit_code, 0);
  Result r = run_ingot(dir_.path(), "run tiny.yaml max_steps=8 checkpoint.save_every=2 resume=true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const char* part : {"max_steps: 8 differs from the 4 steps the checkpoint's cosine LR schedule was fitted to, "
                           "so at step 5 the LR goes from 1.00e-04 to ",
                           "resume_schedule=keep", "resume_schedule=stretch", "max_steps=4"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
}

TEST_F(IngotCli, ResumeScheduleKeepContinuesTheCheckpointsScheduleAndStretchRefitsIt) {
  ASSERT_EQ(run_ingot(dir_.path(), "run tiny.yaml max_steps=4 checkpoint.save_every=2").exit_code, 0);
  Result r = run_ingot(dir_.path(), "run tiny.yaml max_steps=6 checkpoint.save_every=2 resume=true resume_schedule=keep");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resume | max_steps 4 -> 6: the cosine LR schedule keeps its 4 steps (resume_schedule: "
                          "keep); after step 4 the LR stays at train.min_lr"),
            std::string::npos)
      << r.output;
  std::map<int64_t, double> lr = logged_lrs(dir_.file("out/metrics.jsonl"));
  EXPECT_DOUBLE_EQ(lr.at(5), 1e-4);  // train.min_lr: the schedule ended at step 4
  EXPECT_DOUBLE_EQ(lr.at(6), 1e-4);

  r = run_ingot(dir_.path(), "run tiny.yaml max_steps=12 checkpoint.save_every=2 resume=true resume_schedule=stretch");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the cosine LR schedule is refitted to 12 steps (resume_schedule: stretch); at step 7 the "
                          "LR goes from 1.00e-04 to "),
            std::string::npos)
      << r.output;
  EXPECT_GT(logged_lrs(dir_.file("out/metrics.jsonl")).at(7), 1e-3);
}

TEST_F(IngotCli, ResumingAFinishedRunSaysThereIsNothingToTrain) {
  ASSERT_EQ(run_ingot(dir_.path(), "run tiny.yaml max_steps=2 checkpoint.save_every=2").exit_code, 0);
  Result r = run_ingot(dir_.path(), "run tiny.yaml max_steps=2 resume=true --summary s.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resume | the run already finished its 2 steps, so there is nothing to train"),
            std::string::npos)
      << r.output;
  r = run_ingot(dir_.path(), "run tiny.yaml max_steps=1 resume=true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("max_steps: 1 is before the checkpoint's step 2"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ingot
