// Real text as token rows (data.format: token_rows, the layout bench/reference's --make-tokens writes with random
// ids): --rows rows of --seq + 1 little-endian int32 ids, tokenized with ingot's own tokenizer. Each row is the
// tokenizer's BOS (when it has one) followed by the next ids of the text's token stream, so the rows are
// consecutive passages and none repeats another. scripts/device_lora.sh text50 (issue 24) trains on such a file:
// it is made where the tokenizer and the text are (the tokenizer.json is larger than what may travel to the GPU
// machine) and travels as 4 bytes an id.
//   bench_token_rows --tokenizer data/tokenizers/llama3 --text data/kjv.txt --seq 2048 --rows 100 --out PATH
// The text is encoded a line (with its newline) at a time, stopping once the rows are full, so a large text costs
// only the part that is used.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bench/cli.h"
#include "recipes/tokenizer/tokenizer.h"
#include "runtime/error.h"

using namespace ingot;

int main(int argc, char** argv) try {
  std::string tokenizer, text, out;
  int64_t seq = 2048, rows = 100;
  CLI::App app("bench_token_rows: real text as int32 token rows of seq + 1 ids (data.format token_rows)");
  app.add_option("--tokenizer", tokenizer, "directory with tokenizer.json (or vocab.json + merges.txt)")->required();
  app.add_option("--text", text, "a UTF-8 text file")->required();
  app.add_option("--out", out, "the token rows file to write")->required();
  app.add_option("--seq", seq, "data.seq_len: a row holds seq + 1 ids")->capture_default_str();
  app.add_option("--rows", rows, "rows to write (steps x batch for one pass without repeats)")->capture_default_str();
  bench::parse_or_exit(app, argc, argv);
  INGOT_CHECK(seq >= 1 && rows >= 1, "bench_token_rows: --seq and --rows must be positive, got ", seq, " and ", rows);

  const recipes::Tokenizer tok = recipes::Tokenizer::from_dir(tokenizer);
  const std::optional<int32_t> bos = tok.bos_id();
  const int64_t row_len = seq + 1, body = bos ? seq : row_len;
  std::ifstream in(text);
  INGOT_CHECK(in, "bench_token_rows: cannot open --text file '", text, "'");
  std::vector<int32_t> stream;
  std::string line;
  int64_t lines = 0, chars = 0;
  while (static_cast<int64_t>(stream.size()) < rows * body && std::getline(in, line)) {
    line += '\n';
    // Text is data here: "<|begin_of_text|>" written in it stays ordinary tokens.
    const std::vector<int32_t> ids = tok.encode(line, {.add_special_tokens = false, .parse_special = false});
    stream.insert(stream.end(), ids.begin(), ids.end());
    ++lines;
    chars += static_cast<int64_t>(line.size());
  }
  INGOT_CHECK(static_cast<int64_t>(stream.size()) >= rows * body, "bench_token_rows: '", text, "' gives ",
              stream.size(), " tokens, fewer than the ", rows * body, " that ", rows, " rows of ", seq,
              " need; ask for fewer --rows");

  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(rows * row_len));
  for (int64_t r = 0; r < rows; ++r) {
    if (bos) ids.push_back(*bos);
    ids.insert(ids.end(), stream.begin() + r * body, stream.begin() + (r + 1) * body);
  }
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  INGOT_CHECK(f, "bench_token_rows: cannot write --out file '", out, "'");
  f.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * sizeof(int32_t)));
  f.close();
  INGOT_CHECK(f, "bench_token_rows: writing '", out, "' failed");

  std::printf(
      "bench_token_rows: wrote %s: %lld rows of %lld ids (%lld bytes), from %lld lines (%lld bytes) of %s, "
      "tokenizer %s (vocabulary %lld, BOS %s)\n",
      out.c_str(), static_cast<long long>(rows), static_cast<long long>(row_len),
      static_cast<long long>(ids.size() * sizeof(int32_t)), static_cast<long long>(lines),
      static_cast<long long>(chars), text.c_str(), tokenizer.c_str(), static_cast<long long>(tok.vocab_size()),
      bos ? std::to_string(*bos).c_str() : "none");
  const std::span<const int32_t> head(ids.data(), static_cast<size_t>(std::min<int64_t>(row_len, 24)));
  std::printf("row 0 begins: %s\n", tok.decode(head).c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_token_rows: error: %s\n", e.what());
  return 1;
}
