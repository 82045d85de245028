// Our ids against transformers' (tests/fixtures/tokenizers/<name>_reference.json, made by
// tests/fixtures/make_fixtures.py): every case must match exactly, with and without special tokens, and
// decode must give transformers' text. The tokenizer files come from scripts/get_tokenizers.sh.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
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

// transformers' ids for 2000 KJV verses (every `stride`-th line of data/kjv.txt), compared line by line.
void check_kjv_fixture(const std::string& name) {
  std::string ref_path = root("tests/fixtures/tokenizers/" + name + "_kjv_ids.json");
  if (!std::filesystem::exists(ref_path)) GTEST_SKIP() << ref_path << " is missing";
  std::ifstream f(root("data/kjv.txt"));
  if (!f) GTEST_SKIP() << "data/kjv.txt is missing: run scripts/get_data.sh";
  INGOT_REQUIRE_TOKENIZER(tok, name);
  json ref = json::parse(read_file(ref_path));
  const size_t stride = ref["stride"].get<size_t>(), count = ref["count"].get<size_t>();
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(line);
  ASSERT_GE(lines.size(), (count - 1) * stride + 1);
  size_t matched = 0, mismatches = 0;
  for (size_t k = 0; k < count; ++k) {
    const std::string& text = lines[k * stride];
    std::vector<int32_t> got = tok->encode(text), want = ref["ids"][k].get<std::vector<int32_t>>();
    if (got == want) ++matched;
    else if (++mismatches <= 5) ADD_FAILURE() << name << ": line " << k * stride << " differs: " << text;
    if (k % 50 == 0) {
      DecodeOptions raw;
      raw.clean_up_tokenization_spaces = false;
      EXPECT_EQ(tok->decode(want, raw), text);
    }
  }
  EXPECT_EQ(matched, count) << name;
  std::cout << "[ tokenizer ] " << name << ": " << matched << "/" << count << " KJV lines match transformers\n";
}

TEST(TokenizerReference, Gpt2MatchesTransformersOnTwoThousandKjvLines) { check_kjv_fixture("gpt2"); }
TEST(TokenizerReference, Llama3MatchesTransformersOnTwoThousandKjvLines) { check_kjv_fixture("llama3"); }
TEST(TokenizerReference, Qwen3MatchesTransformersOnTwoThousandKjvLines) { check_kjv_fixture("qwen3"); }
TEST(TokenizerReference, Llama2MatchesTransformersOnTwoThousandKjvLines) { check_kjv_fixture("llama2"); }

// Thousands of lines of real text: the first 3000 verses of data/kjv.txt (scripts/get_data.sh) encoded
// without special tokens, compared through the token count and an FNV-1a hash over the ids (each id one
// step) with independent reference encoders run on the same lines: OpenAI's GPT-2 encoder in JavaScript (npm
// gpt-3-encoder@1.1.4) and transformers.js (npm @lenml/tokenizers@3.7.2 with the same tokenizer files).
void check_kjv(const std::string& name, size_t want_tokens, uint64_t want_hash) {
  std::ifstream f(root("data/kjv.txt"));
  if (!f) GTEST_SKIP() << "data/kjv.txt is missing: run scripts/get_data.sh";
  INGOT_REQUIRE_TOKENIZER(tok, name);
  size_t tokens = 0, lines = 0;
  uint64_t h = 1469598103934665603ull;
  for (std::string line; lines < 3000 && std::getline(f, line); ++lines)
    for (int32_t id : tok->encode(line)) {
      ++tokens;
      h = (h ^ uint32_t(id)) * 1099511628211ull;
    }
  ASSERT_EQ(lines, 3000u);
  EXPECT_EQ(tokens, want_tokens) << name;
  EXPECT_EQ(h, want_hash) << name;
}

TEST(TokenizerReference, Gpt2MatchesOpenAIsEncoderOnThreeThousandKjvLines) { check_kjv("gpt2", 98023, 0x49e5b27f34530a80ull); }
TEST(TokenizerReference, Llama3MatchesTransformersJsOnThreeThousandKjvLines) { check_kjv("llama3", 98302, 0x75b2d42d5241669cull); }
TEST(TokenizerReference, Qwen3MatchesTransformersJsOnThreeThousandKjvLines) { check_kjv("qwen3", 98364, 0x7f4950998a8094dfull); }
TEST(TokenizerReference, Llama2MatchesTransformersJsOnThreeThousandKjvLines) { check_kjv("llama2", 106118, 0xd20d18e28a0b9169ull); }

}  // namespace
}  // namespace ingot::recipes
