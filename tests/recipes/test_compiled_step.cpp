// The config's compile.* keys as the compiler's CompileOptions (recipes/compiled_step.cpp): resolved by
// resolve_run (recipes/run_settings.cpp) from the shared schema, then mapped by compile_options().
#include "recipes/compiled_step.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "recipes/train.h"
#include "runtime/file_util.h"
#include "tests/testing.h"

namespace ingot::recipes {
namespace {

using ingot::testing::error_of;

class CompileKeys : public ::testing::Test {
 protected:
  // A pretrain config in `yaml` (q.yaml) plus `overrides`, validated against the recipe's schema.
  Config config(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
    Config c = Config::parse("device: cpu\ndata:\n  path: text.txt\n" + yaml, "q.yaml");
    c.apply_override("output_dir=" + dir_.file("out"));
    for (const std::string& o : overrides) c.apply_override(o);
    c.validate(pretrain_schema());
    return c;
  }
  CompileOptions options_of(const Config& c) {
    ConfigErrors errors;
    RunSettings s = resolve_run(c, errors);
    errors.raise_if_any();
    return compile_options(s.compile);
  }
  TempDir dir_{"ingot_compile_keys_test"};
};

TEST_F(CompileKeys, UnitReductionLagReachesCompileOptions) {
  EXPECT_EQ(options_of(config("")).unit_reduction_lag, 1) << "the default is CompileOptions' default";
  EXPECT_EQ(options_of(config("compile:\n  enabled: true\n  unit_reduction_lag: 0\n")).unit_reduction_lag, 0);
  EXPECT_EQ(options_of(config("", {"compile.unit_reduction_lag=3"})).unit_reduction_lag, 3);
  // A lag as large as the number of units already leaves every wait at the backward's end, so a larger one is
  // clamped to int rather than wrapped around to a negative lag.
  CompileSettings huge;
  huge.unit_reduction_lag = int64_t{1} << 40;
  EXPECT_EQ(compile_options(huge).unit_reduction_lag, std::numeric_limits<int>::max());
}

TEST_F(CompileKeys, ANegativeOrNonIntegerUnitReductionLagIsAnErrorNamingTheKey) {
  EXPECT_EQ(error_of([&] { config("compile:\n  unit_reduction_lag: -1\n"); }),
            "q.yaml:5:23: compile.unit_reduction_lag: expected an integer >= 0, got '-1'");
  EXPECT_EQ(error_of([&] { config("compile:\n  unit_reduction_lag: 1.5\n"); }),
            "q.yaml:5:23: compile.unit_reduction_lag: expected an integer, got '1.5'");
  EXPECT_EQ(error_of([&] { config("", {"compile.unit_reduction_lag=two"}); }),
            "command-line override 'compile.unit_reduction_lag=two': compile.unit_reduction_lag: expected an "
            "integer, got 'two'");
}

TEST_F(CompileKeys, AMisspelledUnitReductionLagIsAnUnknownKeyThatSuggestsIt) {
  const std::string in_file = error_of([&] { config("compile:\n  unit_reductions_lag: 2\n"); });
  EXPECT_NE(in_file.find("q.yaml:5:3: unknown key 'compile.unit_reductions_lag'; did you mean "
                         "'compile.unit_reduction_lag'?"),
            std::string::npos)
      << in_file;
  const std::string outside = error_of([&] { config("", {"unit_reduction_lag=2"}); });
  EXPECT_NE(outside.find("command-line override 'unit_reduction_lag=2': unknown key 'unit_reduction_lag'; did you "
                         "mean 'compile.unit_reduction_lag'?"),
            std::string::npos)
      << outside;
}

}  // namespace
}  // namespace ingot::recipes
