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

fs::path bench_binary() { return fs::read_symlink("/proc/self/exe").parent_path() / "bench_gpt2_step"; }

ingot::testing::ShellResult run_bench(const std::string& args) {
  std::string command = "'";  // appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on a + chain
  command += bench_binary().string();
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
  EXPECT_NE(bogus.output.find("unknown flag --bogus"), std::string::npos) << bogus.output;
}

}  // namespace
}  // namespace ingot
