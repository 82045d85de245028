// Datasets: sources (text, JSONL, instruction, token shards) with their errors, and the loader's packing,
// padding, per-epoch shuffle, rank sharding and resume. A tiny byte-level tokenizer keeps every test
// independent of downloaded files.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "recipes/datasets/loader.h"
#include "recipes/datasets/shards.h"
#include "recipes/datasets/sources.h"
#include "recipes/tokenizer/unicode.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::recipes::datasets {
namespace {

using nlohmann::json;

// Bytes are ids 0..255 (no merges); <|im_start|> 256, <|im_end|> 257, <|endoftext|> 258 (EOS).
const Tokenizer& tiny() {
  static const Tokenizer tok = [] {
    json vocab = json::object();
    const auto& map = unicode::byte_to_char();
    for (int b = 0; b < 256; ++b) vocab[map[b]] = b;
    json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
              {"decoder", {{"type", "ByteLevel"}}},
              {"added_tokens", json::array({{{"id", 256}, {"content", "<|im_start|>"}, {"special", true}},
                                            {{"id", 257}, {"content", "<|im_end|>"}, {"special", true}},
                                            {{"id", 258}, {"content", "<|endoftext|>"}, {"special", true}}})}};
    json cfg = {{"eos_token", "<|endoftext|>"}, {"chat_template", "{% for m in messages %}<|im_start|>...{% endfor %}"}};
    return Tokenizer::from_json(j.dump(), cfg.dump(), "tiny");
  }();
  return tok;
}

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir.file(name), std::ios::binary) << text;
  return dir.file(name);
}

SourceOptions fmt(DatasetFormat f) {
  SourceOptions o;
  o.format = f;
  return o;
}

std::string trained_text(const Example& e) {
  std::vector<int32_t> t;
  for (size_t i = 0; i < e.ids.size(); ++i)
    if (e.labels[i] != kIgnoreIndex) t.push_back(e.ids[i]);
  return tiny().decode(t);
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << needles[0];
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(Datasets, PlainTextLinesBecomeDocumentsEndingWithEos) {
  TempDir dir("ingot_ds_");
  std::string path = write(dir, "a.txt", "In the beginning\n\nGod created\r\n");
  std::vector<Example> ex = load_examples(path, tiny(), fmt(DatasetFormat::Text));
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(tiny().decode(ex[0].ids), "In the beginning<|endoftext|>");
  EXPECT_EQ(ex[0].labels, ex[0].ids);  // pretraining text: every token counts
  SourceOptions whole = fmt(DatasetFormat::Text);
  whole.text_split = TextSplit::File;
  whole.add_eos = false;
  ex = load_examples(path, tiny(), whole);
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(tiny().decode(ex[0].ids), "In the beginning\n\nGod created\r\n");
}

TEST(Datasets, JsonlTextAndPromptCompletionMaskThePrompt) {
  TempDir dir("ingot_ds_");
  std::string path = write(dir, "a.jsonl", "{\"text\": \"hello\"}\n\n{\"prompt\": \"Q: 1+1? A:\", \"completion\": \" 2\"}\n");
  std::vector<Example> ex = load_examples(path, tiny(), fmt(DatasetFormat::Jsonl));
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(trained_text(ex[0]), "hello<|endoftext|>");
  EXPECT_EQ(tiny().decode(ex[1].ids), "Q: 1+1? A: 2<|endoftext|>");
  EXPECT_EQ(trained_text(ex[1]), " 2<|endoftext|>");
  EXPECT_EQ(ex[1].labels[0], kIgnoreIndex);
}

TEST(Datasets, InstructionRecordsTrainOnlyTheReplies) {
  TempDir dir("ingot_ds_");
  std::string path = write(dir, "a.jsonl",
                           "{\"instruction\": \"Add\", \"input\": \"2 3\", \"output\": \"5\"}\n"
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, "
                           "{\"role\": \"assistant\", \"content\": \"Hello\"}, {\"role\": \"user\", \"content\": \"Bye\"}, "
                           "{\"role\": \"assistant\", \"content\": \"Ciao\"}]}\n");
  std::vector<Example> ex = load_examples(path, tiny(), fmt(DatasetFormat::Instruction));  // chatml, detected
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(tiny().decode(ex[0].ids), "<|im_start|>user\nAdd\n\n2 3<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n");
  EXPECT_EQ(trained_text(ex[0]), "5<|im_end|>");
  EXPECT_EQ(trained_text(ex[1]), "Hello<|im_end|>Ciao<|im_end|>");
  SourceOptions alpaca = fmt(DatasetFormat::Instruction);
  alpaca.chat_template = ChatTemplate::from_name("alpaca", tiny());
  ex = load_examples(path, tiny(), alpaca);
  EXPECT_EQ(trained_text(ex[0]), "5<|endoftext|>");
}

TEST(Datasets, BadInputNamesFileAndLine) {
  TempDir dir("ingot_ds_");
  auto load = [&](const std::string& name, const std::string& text, DatasetFormat f) {
    std::string p = write(dir, name, text);
    return [p, f] { load_examples(p, tiny(), fmt(f)); };
  };
  expect_error(load("m.jsonl", "{\"text\": \"a\"}\n\n{\"text\": \"b\"\n", DatasetFormat::Jsonl), {"m.jsonl:3", "malformed JSON"});
  expect_error(load("f.jsonl", "{\"txt\": \"a\"}\n", DatasetFormat::Jsonl), {"f.jsonl:1", "missing field \"text\""});
  expect_error(load("t.jsonl", "{\"text\": 5}\n", DatasetFormat::Jsonl), {"t.jsonl:1", "must be a string"});
  expect_error(load("a.jsonl", "[1, 2]\n", DatasetFormat::Jsonl), {"a.jsonl:1", "expected a JSON object"});
  expect_error(load("e.txt", "  \n\n", DatasetFormat::Text), {"e.txt", "empty"});
  expect_error(load("e.jsonl", "", DatasetFormat::Jsonl), {"e.jsonl", "empty"});
  expect_error(load("i.jsonl", "{\"instruction\": \"x\"}\n", DatasetFormat::Instruction), {"i.jsonl:1", "\"output\""});
  expect_error(load("r.jsonl", "{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}\n", DatasetFormat::Instruction),
               {"r.jsonl:1", "role \"bot\""});
  expect_error(load("n.jsonl", "{\"messages\": []}\n", DatasetFormat::Instruction), {"n.jsonl:1", "non-empty array"});
  expect_error(load("u.txt", "ok\n\xC3(\n", DatasetFormat::Text), {"u.txt", "UTF-8"});
  expect_error([&] { load_examples(dir.file("missing.txt"), tiny(), fmt(DatasetFormat::Text)); }, {"missing.txt"});
  expect_error([] { parse_dataset_format("csv"); }, {"csv", "text, jsonl, instruction, tokens"});
}

TEST(Datasets, TokenShardsRoundTripInBothWidths) {
  TempDir dir("ingot_ds_");
  std::vector<int32_t> small = {0, 1, 65535, 258, 7};
  write_token_shard(dir.file("s.bin"), small, 65536);
  EXPECT_EQ(std::filesystem::file_size(dir.file("s.bin")), 32u + small.size() * 2);
  TokenShard s = read_token_shard(dir.file("s.bin"));
  EXPECT_EQ(s.tokens, small);
  EXPECT_EQ(s.vocab_size, 65536);
  std::vector<int32_t> big = {151643, 0, 70000, 3};
  write_token_shard(dir.file("b.bin"), big, 151936);
  EXPECT_EQ(std::filesystem::file_size(dir.file("b.bin")), 32u + big.size() * 4);
  EXPECT_EQ(read_token_shard(dir.file("b.bin")).tokens, big);
  std::vector<Example> ex = load_examples(dir.file("b.bin"), tiny(), fmt(DatasetFormat::Tokens));
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].ids, big);
  EXPECT_EQ(ex[0].labels, big);
}

// bench/reference's --make-tokens files: int32 rows of seq_len + 1 ids, each row one example that the padding
// loader turns into exactly one full row (inputs = the first seq_len ids, labels = the last seq_len).
TEST(Datasets, TokenRowsAreOneExampleARowAndFillUnpaddedRows) {
  TempDir dir("ingot_ds_");
  const std::vector<int32_t> ids = {5, 6, 7, 8, 9, 120000, 0, 1, 2, 3};  // 2 rows of 5
  std::string bytes(ids.size() * sizeof(int32_t), '\0');
  std::memcpy(bytes.data(), ids.data(), bytes.size());
  SourceOptions o = fmt(DatasetFormat::TokenRows);
  o.row_tokens = 5;
  o.vocab_size = 128256;
  std::vector<Example> ex = load_examples(write(dir, "rows.bin", bytes), tiny(), o);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].ids, std::vector<int32_t>(ids.begin(), ids.begin() + 5));
  EXPECT_EQ(ex[1].ids, std::vector<int32_t>(ids.begin() + 5, ids.end()));
  EXPECT_EQ(ex[1].labels, ex[1].ids);
  LoaderOptions lo;
  lo.seq_len = 4;
  lo.global_batch_size = 2;
  lo.pack = false;
  lo.shuffle = false;
  DataLoader loader(ex, lo);
  Batch b = loader.next();
  EXPECT_EQ(b.input_ids.to_vector(), (std::vector<double>{5, 6, 7, 8, 120000, 0, 1, 2}));
  EXPECT_EQ(b.labels.to_vector(), (std::vector<double>{6, 7, 8, 9, 0, 1, 2, 3}));
  EXPECT_EQ(b.num_loss_tokens, 8);
  expect_error([&] { load_examples(write(dir, "part.bin", bytes.substr(0, 24)), tiny(), o); },
               {"part.bin", "24 bytes", "rows of 5"});
  o.vocab_size = 100000;
  expect_error([&] { load_examples(dir.file("rows.bin"), tiny(), o); }, {"rows.bin", "row 1, token 0", "120000"});
  expect_error([&] { parse_dataset_format("csv"); }, {"token_rows"});
}

TEST(Datasets, BadTokenShardsAreRejectedAndWritesAreAllOrNothing) {
  TempDir dir("ingot_ds_");
  std::vector<int32_t> toks = {1, 2, 3, 4};
  write_token_shard(dir.file("ok.bin"), toks, 100);
  std::string good = read_file(dir.file("ok.bin"));
  expect_error([&] { read_token_shard(write(dir, "trunc.bin", good.substr(0, good.size() - 1))); }, {"trunc.bin", "truncated"});
  expect_error([&] { read_token_shard(write(dir, "short.bin", good.substr(0, 10))); }, {"short.bin", "header"});
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  expect_error([&] { read_token_shard(write(dir, "magic.bin", bad_magic)); }, {"magic.bin", "magic"});
  std::string bad_token = good;
  bad_token[32] = char(200);  // first token 200 >= vocab 100
  expect_error([&] { read_token_shard(write(dir, "tok.bin", bad_token)); }, {"tok.bin", "outside the vocabulary"});
  std::vector<int32_t> out_of_vocab = {1, 100};
  expect_error([&] { write_token_shard(dir.file("ok.bin"), out_of_vocab, 100); }, {"ok.bin", "token 1 = 100"});
  EXPECT_EQ(read_file(dir.file("ok.bin")), good);  // the failed write left the old file untouched
}

// Examples whose ids are 1000*k + position, all trained on, so rows are easy to recognise.
std::vector<Example> numbered(int n, int len) {
  std::vector<Example> ex(n);
  for (int k = 0; k < n; ++k)
    for (int i = 0; i < len; ++i) {
      ex[k].ids.push_back(1000 * k + i);
      ex[k].labels.push_back(1000 * k + i);
    }
  return ex;
}

std::vector<int64_t> values(const Tensor& t) {
  std::vector<double> v = t.to_vector();
  return std::vector<int64_t>(v.begin(), v.end());
}

// Issue 24: packed examples stay apart. Positions restart where an example starts and at a row's first token,
// and an example's last token gets no target from the next example.
TEST(DataLoader, PackingCutsOverlappingRowsWithNextTokenLabelsAndKeepsExamplesApart) {
  LoaderOptions o;
  o.seq_len = 4;
  o.global_batch_size = 2;
  o.shuffle = false;
  DataLoader dl(numbered(2, 5), o);  // stream: 0 1 2 3 4 1000 1001 1002 1003 1004
  EXPECT_EQ(dl.num_rows(), 2);     // (10 - 1) / 4
  Batch b = dl.next();
  EXPECT_EQ(b.input_ids.shape(), (Shape{2, 4}));
  EXPECT_EQ(values(b.input_ids), (std::vector<int64_t>{0, 1, 2, 3, 4, 1000, 1001, 1002}));
  EXPECT_EQ(values(b.labels), (std::vector<int64_t>{1, 2, 3, 4, kIgnoreIndex, 1001, 1002, 1003}));
  EXPECT_EQ(values(b.positions), (std::vector<int64_t>{0, 1, 2, 3, 0, 0, 1, 2}));
  EXPECT_EQ(values(b.attention_mask), std::vector<int64_t>(8, 1));
  EXPECT_EQ(b.num_loss_tokens, 7);
  EXPECT_EQ(dl.position(), (DataPosition{1, 0}));
}

TEST(DataLoader, PaddingMasksPaddingAndPromptTokens) {
  std::vector<Example> ex = numbered(2, 3);
  ex[1].labels[1] = kIgnoreIndex;  // a prompt token
  LoaderOptions o;
  o.seq_len = 4;
  o.global_batch_size = 2;
  o.pack = false;
  o.pad_id = 7;
  o.shuffle = false;
  Batch b = DataLoader(ex, o).next();
  EXPECT_EQ(values(b.input_ids), (std::vector<int64_t>{0, 1, 2, 7, 1000, 1001, 1002, 7}));
  EXPECT_EQ(values(b.labels), (std::vector<int64_t>{1, 2, -100, -100, -100, 1002, -100, -100}));
  EXPECT_EQ(values(b.attention_mask), (std::vector<int64_t>{1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(b.num_loss_tokens, 3);
  EXPECT_FALSE(b.positions.defined());  // one example per row: positions 0..T-1
  // Longer examples are truncated to seq_len + 1 tokens.
  o.seq_len = 2;
  EXPECT_EQ(values(DataLoader(ex, o).next().labels), (std::vector<int64_t>{1, 2, -100, 1002}));
}

TEST(DataLoader, ShuffleIsSeededPerEpochAndVisitsEveryRowOnce) {
  LoaderOptions o;
  o.seq_len = 1;
  o.global_batch_size = 4;
  o.pack = false;
  o.seed = 42;
  std::vector<Example> ex = numbered(16, 2);
  DataLoader a(ex, o), b(ex, o);
  std::vector<int64_t> epoch0, epoch1;
  for (int i = 0; i < 4; ++i) {
    auto v = values(a.next().input_ids);
    EXPECT_EQ(v, values(b.next().input_ids));
    epoch0.insert(epoch0.end(), v.begin(), v.end());
  }
  for (int i = 0; i < 4; ++i) {
    auto v = values(a.next().input_ids);
    epoch1.insert(epoch1.end(), v.begin(), v.end());
  }
  EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()).size(), 16u);
  EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()), std::set<int64_t>(epoch1.begin(), epoch1.end()));
  EXPECT_NE(epoch0, epoch1);  // a new order each epoch
  std::vector<int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(epoch0, sorted);
  o.seed = 43;
  EXPECT_NE(values(DataLoader(ex, o).next().input_ids), std::vector<int64_t>(epoch0.begin(), epoch0.begin() + 4));
}

TEST(DataLoader, GlobalBatchDoesNotDependOnWorldSize) {
  LoaderOptions o;
  o.seq_len = 3;
  o.global_batch_size = 4;
  o.seed = 7;
  std::vector<Example> ex = numbered(9, 7);
  DataLoader single(ex, o);
  for (int step = 0; step < 5; ++step) {
    std::vector<int64_t> whole = values(single.next().input_ids), joined;
    for (int r = 0; r < 2; ++r) {
      LoaderOptions ro = o;
      ro.world_size = 2;
      ro.rank = r;
      DataLoader part(ex, ro);
      part.set_position({step / part.batches_per_epoch(), step % part.batches_per_epoch()});
      Batch b = part.next();
      EXPECT_EQ(b.input_ids.shape(), (Shape{2, 3}));
      auto v = values(b.input_ids);
      joined.insert(joined.end(), v.begin(), v.end());
    }
    EXPECT_EQ(joined, whole) << "step " << step;
  }
}

TEST(DataLoader, ResumeAtASavedPositionContinuesTheSameSequence) {
  LoaderOptions o;
  o.seq_len = 2;
  o.global_batch_size = 2;
  o.seed = 3;
  std::vector<Example> ex = numbered(5, 5);
  DataLoader run(ex, o);
  std::vector<std::vector<int64_t>> seq;
  DataPosition saved;
  for (int i = 0; i < 12; ++i) {
    if (i == 7) saved = run.position();
    seq.push_back(values(run.next().labels));
  }
  EXPECT_GT(saved.epoch, 0);  // the resume point lies past an epoch boundary
  DataLoader resumed(ex, o);
  resumed.set_position(saved);
  for (int i = 7; i < 12; ++i) EXPECT_EQ(values(resumed.next().labels), seq[i]) << i;
}

TEST(DataLoader, BadOptionsAndTooLittleDataAreErrors) {
  std::vector<Example> ex = numbered(4, 4);
  LoaderOptions o;
  o.seq_len = 4;
  o.global_batch_size = 2;
  EXPECT_NO_THROW(DataLoader(ex, o));
  auto bad = [&](auto change, const std::string& needle) {
    LoaderOptions b = o;
    change(b);
    expect_error([&] { DataLoader(ex, b); }, {needle});
  };
  bad([](LoaderOptions& b) { b.seq_len = 0; }, "seq_len");
  bad([](LoaderOptions& b) { b.world_size = 3; }, "not divisible by world size 3");
  bad([](LoaderOptions& b) { b.rank = 2; b.world_size = 2; }, "rank 2");
  bad([](LoaderOptions& b) { b.global_batch_size = 64; }, "fewer than one global batch");
  DataLoader dl(ex, o);
  expect_error([&] { dl.set_position({0, dl.batches_per_epoch()}); }, {"cannot resume"});
}

}  // namespace
}  // namespace ingot::recipes::datasets
