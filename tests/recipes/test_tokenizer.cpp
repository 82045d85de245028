// Tokenizer tests: small hand-made tokenizer.json files exercise each stage and every load error; the real
// GPT-2 / Llama 2 / Llama 3 / Qwen3 files (scripts/get_tokenizers.sh) check round trips on the KJV text and
// known ids. Comparisons with transformers' ids are in test_tokenizer_reference.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "recipes/tokenizer/tokenizer.h"
#include "recipes/tokenizer/unicode.h"
#include "runtime/error.h"
#include "runtime/file_util.h"
#include "test_tokenizer_util.h"

namespace ingot::recipes {
namespace {

using nlohmann::json;

using testing::real_tokenizer;

std::string data_path(const std::string& rel) { return testing::source_path("data/" + rel); }

#define REQUIRE_TOKENIZER(var, name) INGOT_REQUIRE_TOKENIZER(var, name)

std::vector<std::string> kjv_lines(size_t n) {
  std::ifstream f(data_path("kjv.txt"));
  std::vector<std::string> lines;
  for (std::string line; lines.size() < n && std::getline(f, line);) lines.push_back(line);
  return lines;
}

// A byte-level BPE over a 2-letter alphabet plus the bytes; merges "a b" (rank 0) then "ab b" and "Ġ a".
json tiny_byte_level() {
  json vocab = json::object();
  const auto& map = unicode::byte_to_char();
  for (int b = 0; b < 256; ++b) vocab[map[b]] = b;
  vocab["ab"] = 256;
  vocab["abb"] = 257;
  vocab["Ġa"] = 258;
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b", "ab b", "Ġ a"})}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"added_tokens",
           json::array({{{"id", 300}, {"content", "<|end|>"}, {"special", true}},
                        {{"id", 301}, {"content", "<pad>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}},
                        {{"id", 302}, {"content", "[X]"}, {"special", false}}})},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", "<|end|>"}}}}, {{"Sequence", {{"id", "A"}}}}})},
            {"special_tokens", {{"<|end|>", {{"ids", {300}}}}}}}}};
}

// SentencePiece style: "▁" for spaces via normalizer, byte fallback for characters outside the vocab.
json tiny_sentencepiece() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"\xE2\x96\x81", 3}, {"h", 4}, {"i", 5}, {"\xE2\x96\x81h", 6},
                {"\xE2\x96\x81hi", 7}, {"\xE2\x96\x81\xE2\x96\x81", 8}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 10 + b;
  }
  return {{"normalizer",
           {{"type", "Sequence"},
            {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                                         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}})}}},
          {"pre_tokenizer", nullptr},
          {"model",
           {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"\xE2\x96\x81 h", "\xE2\x96\x81h i", "\xE2\x96\x81 \xE2\x96\x81"})},
            {"byte_fallback", true}, {"unk_token", "<unk>"}, {"fuse_unk", true}}},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                      {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
          {"added_tokens", json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}},
                                        {{"id", 2}, {"content", "</s>"}, {"special", true}}})},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}})},
            {"special_tokens", {{"<s>", {{"ids", {1}}}}}}}}};
}

std::vector<int32_t> ids(std::initializer_list<int32_t> l) { return l; }
DecodeOptions skip_special() {
  DecodeOptions o;
  o.skip_special_tokens = true;
  return o;
}

TEST(Tokenizer, ByteLevelMergesLowestRankFirst) {
  Tokenizer t = Tokenizer::from_json(tiny_byte_level().dump(), "", "tiny");
  // "abb": a+b (rank 0) then ab+b (rank 1). " ab": the regex keeps the space with the word, "Ġ a" (rank 2)
  // loses to "a b" (rank 0), so the result is Ġ + ab.
  EXPECT_EQ(t.encode("abb"), ids({257}));
  std::vector<int32_t> space_ab = t.encode(" ab");
  ASSERT_EQ(space_ab.size(), 2u);
  EXPECT_EQ(t.id_to_token(space_ab[0]), "\xC4\xA0");  // Ġ, the byte-level character of ' '
  EXPECT_EQ(space_ab[1], 256);
  EXPECT_EQ(t.encode(" a"), ids({258}));
  EXPECT_EQ(t.decode(t.encode("ab abb a\n\tb")), "ab abb a\n\tb");
}

TEST(Tokenizer, AddedTokensAreSplitOutBeforeBpeAndHonourStripFlags) {
  Tokenizer t = Tokenizer::from_json(tiny_byte_level().dump(), "", "tiny");
  EXPECT_EQ(t.encode("ab<|end|>abb"), ids({256, 300, 257}));
  // <pad> has lstrip and rstrip: the spaces around it belong to it.
  EXPECT_EQ(t.encode("ab  <pad>  ab"), ids({256, 301, 256}));
  EXPECT_EQ(t.encode("[X]ab"), ids({302, 256}));
  // parse_special=false: special tokens are plain text, non-special added tokens still split out.
  std::vector<int32_t> plain = t.encode("<|end|>[X]", {.parse_special = false});
  EXPECT_EQ(plain.back(), 302);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 300), 0);
  EXPECT_EQ(t.decode(plain), "<|end|>[X]");
}

TEST(Tokenizer, PostProcessorAddsSpecialTokensOnlyWhenAsked) {
  Tokenizer t = Tokenizer::from_json(tiny_byte_level().dump(), "", "tiny");
  EXPECT_EQ(t.encode("abb", {.add_special_tokens = true}), ids({300, 257}));
  EXPECT_EQ(t.encode("abb"), ids({257}));
  EXPECT_EQ(t.decode(ids({300, 257}), skip_special()), "abb");
  EXPECT_EQ(t.decode(ids({300, 257})), "<|end|>abb");
  EXPECT_TRUE(t.is_special(300));
  EXPECT_FALSE(t.is_special(302));
  EXPECT_EQ(t.vocab_size(), 303);
}

TEST(Tokenizer, SentencePieceStyleUsesMetaspaceAndByteFallback) {
  Tokenizer t = Tokenizer::from_json(tiny_sentencepiece().dump(), "", "tiny-sp");
  EXPECT_EQ(t.encode("hi"), ids({7}));  // "▁hi"
  EXPECT_EQ(t.encode("hi  hi"), ids({7, 3, 7}));  // "▁hi▁▁hi": the ▁▁ pair loses to ▁h (rank 0)
  // 'é' is not in the vocab: its two UTF-8 bytes become <0xC3> <0xA9>.
  EXPECT_EQ(t.encode("hé"), ids({6, 10 + 0xC3, 10 + 0xA9}));
  EXPECT_EQ(t.encode("hi", {.add_special_tokens = true}), ids({1, 7}));
  for (std::string s : {"hi", "hé hi", "  hi ", "h\xE2\x82\xAC"}) EXPECT_EQ(t.decode(t.encode(s)), s) << s;
  // A cut multi-byte character decodes to U+FFFD per byte, as HF's ByteFallback decoder does.
  EXPECT_EQ(t.decode(ids({10 + 0xC3})), "\xEF\xBF\xBD");
}

// The pieces of `text`, special tokens included.
std::vector<std::string> pieces(const Tokenizer& t, std::string_view text) {
  std::vector<std::string> out;
  for (int32_t id : t.encode(text)) out.push_back(t.id_to_token(id));
  return out;
}

using Pieces = std::vector<std::string>;
const std::string kMeta = "\xE2\x96\x81";

// Issue 24: a tokenizer.json laid out as Llama 2's and Mistral's (Prepend "▁" + Replace normalizers, a
// tokenizer_config.json naming LlamaTokenizer; tests/fixtures/make_sentencepiece_fixture.py). A text starting
// with a space keeps every "▁", as HF tokenizers 0.23 and SentencePiece encode it: the issue's pieces, which
// transformers.js (npm @lenml/tokenizers 3.7.2, the file's own pipeline) also gives on this fixture. The
// transformers 5 rebuild that we followed before gave ["▁", "▁This", "▁report"], ["▁\"", "Some", "one"] and
// ["<s>", "▁", "</s>"].
TEST(Tokenizer, PrependNormalizerKeepsEveryLeadingSpaceAsHfTokenizersDoes) {
  Tokenizer t = Tokenizer::from_dir(testing::source_path("tests/fixtures/tokenizers/sentencepiece_prepend"));
  const std::string& m = kMeta;
  EXPECT_EQ(pieces(t, "  This report"), (Pieces{m + m, m + "This", m + "report"}));
  EXPECT_EQ(pieces(t, " \"Someone"), (Pieces{m, m + "\"", "Some", "one"}));
  // Each text section between special tokens gets its own "▁", so the space between them becomes "▁▁".
  EXPECT_EQ(pieces(t, "<s> </s>"), (Pieces{"<s>", m + m, "</s>"}));
  EXPECT_EQ(pieces(t, "<s>  This</s>"), (Pieces{"<s>", m + m, m + "This", "</s>"}));
  EXPECT_EQ(pieces(t, "This report"), (Pieces{m + "This", m + "report"}));
  EXPECT_EQ(t.encode("  This report", {.add_special_tokens = true}), ids({1, 289, 276, 282}));
  for (std::string s : {"  This report", " \"Someone", "This report", "   This"})
    EXPECT_EQ(t.decode(t.encode(s)), s) << s;
}

// add_prefix_space: false in tokenizer_config.json drops the prepended "▁" (transformers builds the normalizer
// without its Prepend), so a leading space is one "▁" and decoding keeps it.
TEST(Tokenizer, AddPrefixSpaceFalseDropsThePrependedMetaspace) {
  std::string dir = testing::source_path("tests/fixtures/tokenizers/sentencepiece_prepend");
  json cfg = json::parse(read_file(dir + "/tokenizer_config.json"));
  cfg["add_prefix_space"] = false;
  Tokenizer t = Tokenizer::from_json(read_file(dir + "/tokenizer.json"), cfg.dump(), "no-prefix");
  const std::string& m = kMeta;
  EXPECT_EQ(pieces(t, "  This report"), (Pieces{m, m + "This", m + "report"}));
  EXPECT_EQ(pieces(t, "This"), (Pieces{"T", "hi", "s"}));
  EXPECT_EQ(t.decode(t.encode(" This report")), " This report");
  EXPECT_EQ(t.encode("This", {.add_special_tokens = true}).front(), 1);
}

TEST(Tokenizer, LoadErrorsNameTheFileAndTheProblem) {
  auto expect_error = [](const std::string& text, const std::string& needle) {
    try {
      Tokenizer::from_json(text, "", "bad.json");
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    }
  };
  expect_error("{not json", "not valid JSON");
  expect_error("{}", "\"model\"");
  json j = tiny_byte_level();
  j["model"]["merges"].push_back("zz q");
  expect_error(j.dump(), "missing from the vocab");
  j = tiny_byte_level();
  j["model"]["merges"].push_back("a a");
  expect_error(j.dump(), "\"aa\", which is missing");
  j = tiny_byte_level();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  expect_error(j.dump(), "normalizer type \"BertNormalizer\" is not supported");
  j = tiny_byte_level();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(j.dump(), "pre_tokenizer type \"Whitespace\"");
  j = tiny_byte_level();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j.dump(), "decoder type \"WordPiece\"");
  j = tiny_byte_level();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}};
  expect_error(j.dump(), "regex does not compile");
  j = tiny_byte_level();
  j["model"]["vocab"]["dup"] = 256;
  expect_error(j.dump(), "id 256 is used by both");
  j = tiny_byte_level();
  j["model"]["continuing_subword_prefix"] = "##";
  expect_error(j.dump(), "continuing_subword_prefix");
}

TEST(Tokenizer, EncodeAndDecodeRejectBadInput) {
  Tokenizer t = Tokenizer::from_json(tiny_byte_level().dump(), "", "tiny");
  EXPECT_THROW(t.encode("ab\xFF"), Error);
  EXPECT_THROW(t.decode(ids({999})), Error);
  EXPECT_THROW(t.id_to_token(-1), Error);
}

TEST(Tokenizer, ConfigSuppliesSpecialIdsAndTemplate) {
  json cfg = {{"bos_token", "<|end|>"}, {"eos_token", {{"content", "<|end|>"}}}, {"pad_token", nullptr},
              {"chat_template", "{{ x }}"}};
  Tokenizer t = Tokenizer::from_json(tiny_byte_level().dump(), cfg.dump(), "tiny");
  EXPECT_EQ(t.bos_id(), 300);
  EXPECT_EQ(t.eos_id(), 300);
  EXPECT_FALSE(t.pad_id().has_value());
  EXPECT_EQ(t.chat_template(), "{{ x }}");
  cfg["bos_token"] = "<nope>";
  EXPECT_THROW(Tokenizer::from_json(tiny_byte_level().dump(), cfg.dump(), "tiny"), Error);
}

TEST(Tokenizer, Gpt2VocabAndMergesFilesLoadAndBadLinesAreReported) {
  TempDir dir("ingot_tok_");
  json vocab = tiny_byte_level()["model"]["vocab"];
  vocab["<|endoftext|>"] = 259;
  std::ofstream(dir.file("vocab.json")) << vocab.dump();
  std::ofstream(dir.file("merges.txt")) << "#version: 0.2\na b\nab b\n\xC4\xA0 a\n";
  Tokenizer t = Tokenizer::from_dir(dir.path());
  EXPECT_EQ(t.encode("abb a<|endoftext|>"), ids({257, 258, 259}));
  EXPECT_EQ(t.eos_id(), 259);
  std::ofstream(dir.file("merges.txt")) << "#version: 0.2\na b\nab b c\n";
  try {
    Tokenizer::from_dir(dir.path());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("merges.txt:3"), std::string::npos) << e.what();
  }
  TempDir empty("ingot_tok_");
  EXPECT_THROW(Tokenizer::from_dir(empty.path()), Error);
}

TEST(Tokenizer, Gpt2EncodesKnownIds) {
  REQUIRE_TOKENIZER(t, "gpt2");
  EXPECT_EQ(t->encode("Hello world"), ids({15496, 995}));
  EXPECT_EQ(t->encode(" leading  spaces, 12345 's DON'T"),
            ids({3756, 220, 9029, 11, 17031, 2231, 705, 82, 23917, 6, 51}));
  EXPECT_EQ(t->encode("<|endoftext|>"), ids({50256}));
  EXPECT_EQ(t->vocab_size(), 50257);
}

void check_round_trip(const std::string& name) {
  std::vector<std::string> lines = kjv_lines(400);
  if (lines.empty()) GTEST_SKIP() << "data/kjv.txt is missing: run scripts/get_data.sh";
  REQUIRE_TOKENIZER(t, name);
  lines.push_back("Tabs\tand\nnewlines\n\n\nand \r\n windows  ");
  lines.push_back("  Unicode: caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\xA4\x97 e\xCC\x81 <|endoftext|>");
  DecodeOptions raw;
  raw.clean_up_tokenization_spaces = false;
  for (const std::string& s : lines) {
    std::vector<int32_t> got = t->encode(s);
    // Qwen normalizes to NFC, so e + combining acute comes back as the single character. Llama 2's decoder
    // strips the one "▁" its normalizer prepends, so text starting with spaces keeps them all (issue 24).
    std::string want = name == "qwen3" ? unicode::nfc(s) : s;
    ASSERT_EQ(t->decode(got, raw), want) << name << ": " << s;
  }
}

TEST(Tokenizer, Gpt2RoundTripsKjvAndMixedText) { check_round_trip("gpt2"); }
TEST(Tokenizer, Llama3RoundTripsKjvAndMixedText) { check_round_trip("llama3"); }
TEST(Tokenizer, Qwen3RoundTripsKjvAndMixedText) { check_round_trip("qwen3"); }
TEST(Tokenizer, Llama2RoundTripsKjvAndMixedText) { check_round_trip("llama2"); }

TEST(Tokenizer, KjvThroughputIsReported) {
  std::vector<std::string> lines = kjv_lines(4000);
  if (lines.empty()) GTEST_SKIP() << "data/kjv.txt is missing: run scripts/get_data.sh";
  for (const char* name : {"gpt2", "llama3"}) {
    const Tokenizer* t = real_tokenizer(name);
    if (!t) GTEST_SKIP() << "data/tokenizers/" << name << " is missing: run scripts/get_tokenizers.sh";
    Tokenizer fresh = *t;
    size_t tokens = 0, bytes = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& l : lines) {
      tokens += fresh.encode(l).size();
      bytes += l.size();
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GT(tokens, bytes / 8);
    std::cout << "[ tokenizer ] " << name << ": " << tokens << " tokens from " << bytes << " bytes in " << s
              << " s = " << tokens / s << " tokens/s\n";
  }
}

}  // namespace
}  // namespace ingot::recipes
