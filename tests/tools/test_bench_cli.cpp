// End-to-end tests of bench_gpt2_step's command line: they run the built binary (bin/bench_gpt2_step beside
// bin/ingot_tests) on a tiny model on the CPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/shell.h"

namespace ingot {
namespace {

namespace fs = std::filesystem;

fs::path bench_binary(const std::string& name = "bench_gpt2_step") {
  return fs::read_symlink("/proc/self/exe").parent_path() / name;
}

ingot::testing::ShellResult run_bench(const std::string& args, const std::string& name = "bench_gpt2_step") {
  std::string command = "'";  // appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on a + chain
  command += bench_binary(name).string();
  command += "' ";
  command += args;
  command += " 2>&1";
  return ingot::testing::run_shell(command);
}

constexpr const char* kTiny =
    "--device cpu --dtype f32 --batch 1 --seq 16 --layers 1 --heads 2 --embd 16 --vocab 64 --steps 1 --warmup 1";

// The cells of the table row whose first cell starts with `mode` ("" when there is none).
std::vector<std::string> row_cells(const std::string& output, const std::string& mode) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| " + mode + " |", 0) != 0) continue;
    std::vector<std::string> cells;
    std::istringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) {
      const size_t b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
      cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
    }
    return cells;
  }
  return {};
}

TEST(BenchGpt2Step, RegionalCompileIsNamedInItsRowAndMfuIsADashOnCpus) {
  ASSERT_TRUE(fs::exists(bench_binary())) << bench_binary();
  const fs::path cache = fs::temp_directory_path() / ("ingot_bench_cli_" + std::to_string(::getpid()));
  const auto r = run_bench(std::string(kTiny) + " --compile default --regional --cache-dir '" + cache.string() + "'");
  fs::remove_all(cache);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> cells = row_cells(r.output, "ingot compile default regional");
  ASSERT_EQ(cells.size(), 12u) << r.output;
  EXPECT_EQ(cells[1], "cpu");
  EXPECT_EQ(cells[8], "-") << "MFU on a CPU";
  EXPECT_NE(r.output.find("| TFLOP/s | MFU | peak mem GB |"), std::string::npos) << r.output;
}

TEST(BenchGpt2Step, EagerRowsAreNotRegionalAndBadFlagsAreNamed) {
  ASSERT_TRUE(fs::exists(bench_binary())) << bench_binary();
  const auto eager = run_bench(std::string(kTiny) + " --regional");
  ASSERT_EQ(eager.exit_code, 0) << eager.output;
  EXPECT_EQ(row_cells(eager.output, "ingot eager").size(), 12u) << "--regional without --compile: " << eager.output;
  const auto peak = run_bench(std::string(kTiny) + " --peak-tflops 0");
  EXPECT_NE(peak.exit_code, 0);
  EXPECT_NE(peak.output.find("--peak-tflops must be positive, got 0"), std::string::npos) << peak.output;
  const auto bogus = run_bench("--bogus 1");
  EXPECT_NE(bogus.exit_code, 0);
  EXPECT_NE(bogus.output.find("--bogus"), std::string::npos) << bogus.output;
}

// Note [SM carve-out] (runtime/sm_budget.h): --sm-carveout, else INGOT_SM_CARVEOUT, is named in the row (so a
// RESULTS row says it), and a bad one stops the bench before any step with an error naming where it came from.
TEST(BenchGpt2Step, SmCarveoutIsNamedInTheRowAndABadOneIsRefused) {
  ASSERT_TRUE(fs::exists(bench_binary())) << bench_binary();
  const auto flag = run_bench(std::string(kTiny) + " --sm-carveout 8");
  ASSERT_EQ(flag.exit_code, 0) << flag.output;
  EXPECT_EQ(row_cells(flag.output, "ingot eager carveout 8").size(), 12u) << flag.output;
  auto with_env = [](const std::string& value, const std::string& args) {
    std::string command = "INGOT_SM_CARVEOUT=" + value + " '";
    command += bench_binary().string();
    command += "' ";
    command += args;
    command += " 2>&1";
    return ingot::testing::run_shell(command);
  };
  const auto env = with_env("4", kTiny);
  ASSERT_EQ(env.exit_code, 0) << env.output;
  EXPECT_EQ(row_cells(env.output, "ingot eager carveout 4").size(), 12u) << env.output;
  const auto flag_wins = with_env("4", std::string(kTiny) + " --sm-carveout 0");
  ASSERT_EQ(flag_wins.exit_code, 0) << flag_wins.output;
  EXPECT_EQ(row_cells(flag_wins.output, "ingot eager").size(), 12u) << "--sm-carveout 0 turns it off: "
                                                                     << flag_wins.output;
  const auto bad_env = with_env("x", kTiny);
  EXPECT_NE(bad_env.exit_code, 0);
  EXPECT_NE(bad_env.output.find("INGOT_SM_CARVEOUT='x': expected an SM carve-out"), std::string::npos)
      << bad_env.output;
  EXPECT_EQ(bad_env.output.find("| ingot"), std::string::npos) << "refused before any step: " << bad_env.output;
  const auto negative = run_bench(std::string(kTiny) + " --sm-carveout -1");
  EXPECT_NE(negative.exit_code, 0);
  EXPECT_NE(negative.output.find("--sm-carveout=-1: expected an SM carve-out >= 0"), std::string::npos)
      << negative.output;
}

// Every bench parses with CLI11: --help lists every flag, a bad flag or
// value is named and nothing runs.
TEST(BenchCli, EveryBenchNamesBadFlagsAndListsItsFlags) {
  for (const char* name : {"bench_gpt2_step", "bench_llama_step", "bench_allreduce", "bench_compile_cpu"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(fs::exists(bench_binary(name))) << bench_binary(name);
    const auto bogus = run_bench("--bogus 1", name);
    EXPECT_NE(bogus.exit_code, 0);
    EXPECT_NE(bogus.output.find("--bogus"), std::string::npos) << bogus.output;
    const auto help = run_bench("--help", name);
    EXPECT_EQ(help.exit_code, 0) << help.output;
    EXPECT_NE(help.output.find("Usage: "), std::string::npos) << help.output;
  }
  const auto help = run_bench("--help", "bench_llama_step");
  for (const char* flag : {"--config", "--checkpoint", "--tokens", "--zero-stage", "--keep-after-forward", "--params",
                           "--reduce-dtype", "--timeline", "--losses", "--peak-tflops", "--compile", "--layers",
                           "--sm-carveout", "--reduce-wire-dtype"})
    EXPECT_NE(help.output.find(flag), std::string::npos) << flag << " missing from --help:\n" << help.output;
  const auto typo = run_bench("--batch two", "bench_llama_step");
  EXPECT_NE(typo.exit_code, 0);
  EXPECT_NE(typo.output.find("--batch"), std::string::npos) << typo.output;
  const auto stage = run_bench("--config /nonexistent.json --zero-stage 4", "bench_llama_step");
  EXPECT_NE(stage.exit_code, 0);
  EXPECT_NE(stage.output.find("--zero-stage must be 0..3, got 4"), std::string::npos) << stage.output;
}

// --unit-reduction-lag N is CompileOptions::unit_reduction_lag of a compiled ZeRO-3 step; a negative one is refused
// before anything is built.
TEST(BenchCli, StepBenchesTakeAUnitReductionLagAndRefuseANegativeOne) {
  for (const std::string name : {"bench_gpt2_step", "bench_llama_step"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(fs::exists(bench_binary(name))) << bench_binary(name);
    const auto help = run_bench("--help", name);
    EXPECT_NE(help.output.find("--unit-reduction-lag"), std::string::npos) << help.output;
    const std::string config = name == "bench_llama_step" ? "--config /nonexistent.json " : "";
    const auto negative = run_bench(config + "--unit-reduction-lag -1", name);
    EXPECT_NE(negative.exit_code, 0);
    EXPECT_NE(negative.output.find(name + ": --unit-reduction-lag must be >= 0, got -1"),
              std::string::npos)
        << negative.output;
    EXPECT_EQ(negative.output.find("| ingot"), std::string::npos) << "refused before any step: " << negative.output;
  }
}

// A compiled ZeRO-3 row says its lag unless it is the default 1 (2 Gloo ranks under `ingot launch`).
TEST(BenchGpt2Step, ACompiledZero3RowNamesANonDefaultUnitReductionLag) {
  ASSERT_TRUE(fs::exists(bench_binary("ingot"))) << "build the `ingot` target too";
  const fs::path cache = fs::temp_directory_path() / ("ingot_bench_lag_" + std::to_string(::getpid()));
  auto launched = [&](const std::string& lag) {
    std::string command = "'";
    command += bench_binary("ingot").string();
    command += "' launch --nproc-per-node 2 -- '";
    command += bench_binary().string();
    command += "' ";
    command += kTiny;
    command += " --zero-stage 3 --compile default --cache-dir '";
    command += cache.string();
    command += "' --unit-reduction-lag ";
    command += lag;
    command += " 2>&1";
    return ingot::testing::run_shell(command);
  };
  const auto lag0 = launched("0"), lag1 = launched("1");
  fs::remove_all(cache);
  ASSERT_EQ(lag0.exit_code, 0) << lag0.output;
  ASSERT_EQ(lag1.exit_code, 0) << lag1.output;
  EXPECT_EQ(row_cells(lag0.output, "ingot compile default ZeRO-3 x2 unit lag 0").size(), 12u) << lag0.output;
  EXPECT_EQ(row_cells(lag1.output, "ingot compile default ZeRO-3 x2").size(), 12u) << lag1.output;
}

// bench_allreduce's reduce-scatters on 2 Gloo ranks under `ingot launch`: a row per op naming it and its dtype
// (reduce_scatter_widen: bf16 summed into f32, Note [Narrow wire, wide sum]); a widened f32 input is refused.
TEST(BenchAllreduce, TimesEachOpOnGlooRanksAndRefusesAWidenedF32Input) {
  ASSERT_TRUE(fs::exists(bench_binary("ingot"))) << "build the `ingot` target too";
  auto launched = [&](const std::string& args) {
    std::string command = "'";
    command += bench_binary("ingot").string();
    command += "' launch --nproc-per-node 2 -- '";
    command += bench_binary("bench_allreduce").string();
    command += "' --device cpu --min-mb 1 --max-mb 1 --iters 2 ";
    command += args;
    command += " 2>&1";
    return ingot::testing::run_shell(command);
  };
  for (const std::string op : {"all_reduce", "reduce_scatter", "reduce_scatter_widen", "all_to_all"}) {
    SCOPED_TRACE(op);
    const auto r = launched("--op " + op + " --dtype bf16");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<std::string> cells = row_cells(r.output, op);
    ASSERT_EQ(cells.size(), 11u) << r.output;
    EXPECT_EQ(cells[1], "bf16") << r.output;
    EXPECT_EQ(cells[2], "1048576") << "the input's bytes: " << r.output;
  }
  const auto bad = launched("--op reduce_scatter_widen --dtype f32");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("--op reduce_scatter_widen sums a bf16 input into f32: use --dtype bf16"),
            std::string::npos) << bad.output;
}

}  // namespace
}  // namespace ingot
