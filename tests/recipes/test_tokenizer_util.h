// Shared by the tokenizer, chat and dataset tests: the real tokenizers of scripts/get_tokenizers.sh, each
// loaded once per test binary (a 10 MB tokenizer.json takes a moment to read).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "recipes/tokenizer/tokenizer.h"

namespace ingot::recipes::testing {

inline std::string source_path(const std::string& rel) { return std::string(INGOT_SOURCE_DIR) + "/" + rel; }

// nullptr when data/tokenizers/<name> is missing.
inline const Tokenizer* real_tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> loaded;
  auto it = loaded.find(name);
  if (it != loaded.end()) return &it->second;
  std::string dir = source_path("data/tokenizers/" + name);
  if (!std::filesystem::exists(dir)) return nullptr;
  return &loaded.emplace(name, Tokenizer::from_dir(dir)).first->second;
}

}  // namespace ingot::recipes::testing

// Declares `var` as the named real tokenizer, or skips the test saying how to get it.
#define INGOT_REQUIRE_TOKENIZER(var, name)                                                 \
  const ::ingot::recipes::Tokenizer* var = ::ingot::recipes::testing::real_tokenizer(name); \
  if (!var) GTEST_SKIP() << "data/tokenizers/" << (name) << " is missing: run scripts/get_tokenizers.sh"
