// Our ids against transformers' (tests/fixtures/tokenizers/<name>_reference.json, made by
// tests/fixtures/make_fixtures.py): every case must match exactly, with and without special tokens, and
// decode must give transformers' text. The tokenizer files come from scripts/get_tokenizers.sh.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>

#include "recipes/tokenizer/tokenizer.h"
#include "runtime/file_util.h"
#include "test_tokenizer_util.h"

namespace ingot::recipes {
namespace {

using nlohmann::json;

std::string root(const std::string& rel) { return std::string(INGOT_SOURCE_DIR) + "/" + rel; }

void check_reference(const std::string& name) {
  std::string ref_path = root("tests/fixtures/tokenizers/" + name + "_reference.json");
  if (!std::filesystem::exists(ref_path)) GTEST_SKIP() << ref_path << " is missing";
  INGOT_REQUIRE_TOKENIZER(loaded, name);
  const Tokenizer& tok = *loaded;
  json ref = json::parse(read_file(ref_path));
  size_t matched = 0, total = 0;
  for (const auto& c : ref["cases"]) {
    std::string text = c["text"].get<std::string>();
    auto want = c["ids"].get<std::vector<int32_t>>();
    auto want_special = c["ids_with_special"].get<std::vector<int32_t>>();
    std::vector<int32_t> got = tok.encode(text);
    EncodeOptions with_special;
    with_special.add_special_tokens = true;
    std::vector<int32_t> got_special = tok.encode(text, with_special);
    std::string decoded = tok.decode(want);
    EXPECT_EQ(got, want) << name << ": ids of " << json(text).dump();
    EXPECT_EQ(got_special, want_special) << name << ": ids with special tokens of " << json(text).dump();
    EXPECT_EQ(decoded, c["decoded"].get<std::string>()) << name << ": decode of " << json(text).dump();
    ++total;
    matched += got == want && got_special == want_special && decoded == c["decoded"].get<std::string>();
  }
  EXPECT_GT(total, 10u);
  std::cout << "[ tokenizer ] " << name << ": " << matched << "/" << total << " reference cases match transformers\n";
}

TEST(TokenizerReference, Llama3MatchesTransformersOnEveryCase) { check_reference("llama3"); }
TEST(TokenizerReference, Qwen3MatchesTransformersOnEveryCase) { check_reference("qwen3"); }
TEST(TokenizerReference, Llama2MatchesTransformersOnEveryCase) { check_reference("llama2"); }
TEST(TokenizerReference, Gpt2MatchesTransformersOnEveryCase) { check_reference("gpt2"); }

}  // namespace
}  // namespace ingot::recipes
