// The test binary finds configs and fixtures from a root it is given (tests/test_root.h), so it runs where it
// was not built (the lent GPU machine's checkout).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/shell.h"

namespace {

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

// Runs this test in a child with `env` and returns the root it reported.
std::string child_root(const std::string& env) {
  const auto r = ingot::testing::run_shell("env " + env + " INGOT_TEST_ROOT_PROBE=1 '" + self_exe() +
                                           "' --gtest_filter=TestRoot.ProbeReportsTheRoot 2>&1");
  const size_t at = r.output.find("root=[");
  if (at == std::string::npos) return "(no root in: " + r.output + ")";
  const size_t end = r.output.find(']', at);
  return r.output.substr(at + 6, end - at - 6);
}

}  // namespace

TEST(TestRoot, ProbeReportsTheRoot) {
  if (!std::getenv("INGOT_TEST_ROOT_PROBE")) GTEST_SKIP() << "runs only as the child of TestRoot.* below";
  std::printf("root=[%s]\n", INGOT_SOURCE_DIR);
}

TEST(TestRoot, IsTheEnvironmentVariableWhenSet) {
  EXPECT_EQ(child_root("INGOT_TEST_ROOT=/tmp/ingot-checkout-elsewhere"), "/tmp/ingot-checkout-elsewhere");
}

TEST(TestRoot, IsTheSourceTreeOtherwise) {
  EXPECT_EQ(child_root("-u INGOT_TEST_ROOT"), INGOT_BUILD_SOURCE_DIR);
  EXPECT_TRUE(std::filesystem::exists(std::string(INGOT_SOURCE_DIR) + "/configs/quickstart.yaml"));
}
