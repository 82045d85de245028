// A test directory with a tiny pretraining recipe (GPT-2 of `n_layer` layers, 16 wide, on a repeated KJV line,
// 6 steps) and the built `ingot` next to the test binary: the fixture of the tests that run `ingot run` and
// `ingot launch` as a user would (DistributedRun.*, ShardedRun.*).
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "runtime/file_util.h"
#include "tests/shell.h"

namespace ingot::testing {

// The folder of the running test binary, where the build puts `ingot` and the benchmarks beside it.
inline std::filesystem::path bin_dir() { return std::filesystem::read_symlink("/proc/self/exe").parent_path(); }

class TinyRun : public ::testing::Test {
 protected:
  TinyRun(const char* dir_prefix, int n_layer) : n_layer_(n_layer), dir_(dir_prefix) {}
  static std::filesystem::path bin_dir() { return testing::bin_dir(); }
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(bin_dir() / "ingot")) << "build the `ingot` target too";
    std::string text;
    for (int i = 0; i < 40; ++i) text += "And God said, Let there be light: and there was light.\n";
    std::ofstream(dir_.file("text.txt")) << text;
    std::ofstream(dir_.file("tiny.yaml"))
        << "recipe: pretrain\ndevice: cpu\nmax_steps: 6\nseed: 3\n"
           "data: {path: text.txt}\n"
           "model: {n_layer: " << n_layer_ << ", n_head: 2, n_embd: 16, block_size: 8}\n"
           "train: {batch_size: 12, lr: 1.0e-2, warmup_steps: 2, log_every: 1, eval_batches: 2}\n"
           "logging: {plot: false}\n";
  }
  // Runs a shell command line in the test directory with $INGOT the built binary.
  ShellResult sh(const std::string& cmd) {
    return run_shell("cd '" + dir_.path() + "' && INGOT='" + (bin_dir() / "ingot").string() + "' && (" + cmd +
                     ") 2>&1");
  }
  // One process, no launcher.
  ShellResult single(const std::string& out, const std::string& overrides = "") {
    return sh("\"$INGOT\" run tiny.yaml output_dir=" + out + " " + overrides);
  }
  ShellResult launch(int nproc, const std::string& out, const std::string& overrides = "",
                     const std::string& launch_flags = "", const std::string& env = "") {
    return sh(env + " \"$INGOT\" launch --nproc-per-node " + std::to_string(nproc) + " " + launch_flags +
              " -- \"$INGOT\" run tiny.yaml output_dir=" + out + " " + overrides);
  }
  std::string path(const std::string& name) const { return dir_.file(name); }

  int n_layer_;
  TempDir dir_;
};

// The train losses of a run's metrics.jsonl by step. each_step_once: a step logged twice fails the test (a fresh
// run or an exact resume logs every step once); false keeps the last record of a step (runs resumed from an
// earlier checkpoint log its later steps again).
inline std::map<int64_t, double> train_losses(const std::string& metrics, bool each_step_once = true) {
  std::ifstream in(metrics);
  std::map<int64_t, double> out;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["kind"] != "train") continue;
    const int64_t step = j["step"].get<int64_t>();
    if (each_step_once) {
      EXPECT_EQ(out.count(step), 0u) << "step " << step << " logged twice in " << metrics;
    }
    out[step] = j["loss"].get<double>();
  }
  return out;
}

// Every step of `want` is in `got` with a loss within `rel_tol` of want's, relatively, and no step more.
inline void expect_same_losses(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want,
                               double rel_tol, const std::string& what) {
  ASSERT_FALSE(want.empty()) << what;
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [step, loss] : want) {
    ASSERT_TRUE(got.count(step)) << what << ": no step " << step;
    EXPECT_NEAR(got.at(step), loss, rel_tol * std::abs(loss)) << what << " at step " << step;
  }
}

}  // namespace ingot::testing
