// Training examples from files: plain text, JSONL text completion, instruction JSONL and pre-tokenized shards,
// each turned into token ids plus per-token labels (the id itself where the loss counts, kIgnoreIndex for
// prompt tokens). The loader (loader.h) packs or pads them into fixed-shape batches.
//
// Formats (DatasetFormat):
//   text         a UTF-8 file; every non-empty line is a document (text_split = Line), or the whole file is
//                one (text_split = File)
//   jsonl        one JSON object per line with a string field `text_field` ("text"), or "prompt" +
//                "completion" (the prompt is masked from the loss)
//   instruction  one JSON object per line, either alpaca-style {"instruction", "input" (optional), "output"}
//                or {"messages": [{"role", "content"}, ...]}, rendered with a chat template (chat.h): only the
//                assistant replies are trained on
//   tokens       a binary token shard (shards.h): one document, all tokens trained on
//   token_rows   raw little-endian int32 token ids in rows of `row_tokens` (the files bench/reference's
//                --make-tokens writes): one example a row, all tokens trained on, every id below `vocab_size`
// Errors name the file and the 1-based line: malformed JSON, a missing or non-string field, an empty file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "recipes/tokenizer/chat.h"
#include "recipes/tokenizer/tokenizer.h"

namespace ingot::recipes::datasets {

struct Example {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // same length as ids; kIgnoreIndex where the loss does not count
};

enum class DatasetFormat { Text, Jsonl, Instruction, Tokens, TokenRows };
enum class TextSplit { Line, File };

struct SourceOptions {
  DatasetFormat format = DatasetFormat::Text;
  TextSplit text_split = TextSplit::Line;
  std::string text_field = "text";
  // Add the tokenizer's BOS before and EOS after every text / completion document (when it has them), so
  // packed documents stay separated. Chat templates place their own.
  bool add_bos = false;
  bool add_eos = true;
  // Instruction data: the template to render with; nullopt: detected from the tokenizer (ChatTemplate::detect).
  std::optional<ChatTemplate> chat_template;
  // token_rows: ids per row (seq_len + 1: inputs and the last target) and the bound every id stays below.
  int64_t row_tokens = 0;
  int64_t vocab_size = 0;
};

// "text", "jsonl", "instruction", "tokens" or "token_rows"; throws listing them.
DatasetFormat parse_dataset_format(const std::string& name);

// Every example of the file, in file order. `tok` is unused for tokens shards and token rows.
std::vector<Example> load_examples(const std::string& path, const Tokenizer& tok, const SourceOptions& opts);

}  // namespace ingot::recipes::datasets
