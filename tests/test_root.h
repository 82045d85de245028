// Where tests find configs and fixtures. Force-included into every test source (tests/CMakeLists.txt), so
// INGOT_SOURCE_DIR below is what every test spells: $INGOT_TEST_ROOT when set, else the source tree the binary
// was built from, else (a binary carried to a machine without that tree, e.g. the lent GPU machine) the
// current directory. scripts/device_check.sh sets INGOT_TEST_ROOT to the checkout it runs in.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace ingot::testing {

inline const char* source_root() {
  static const std::string root = [] {
    if (const char* env = std::getenv("INGOT_TEST_ROOT"); env && *env) return std::string(env);
    std::error_code ec;
    if (std::filesystem::is_directory(INGOT_BUILD_SOURCE_DIR, ec)) return std::string(INGOT_BUILD_SOURCE_DIR);
    return std::filesystem::current_path(ec).string();
  }();
  return root.c_str();
}

}  // namespace ingot::testing

#define INGOT_SOURCE_DIR ::ingot::testing::source_root()
