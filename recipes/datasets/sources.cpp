#include "recipes/datasets/sources.h"

#include <cstring>

#include <nlohmann/json.hpp>

#include "recipes/datasets/shards.h"
#include "recipes/tokenizer/unicode.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::recipes::datasets {

namespace {

using nlohmann::json;

// Calls fn(line, line_number) for every line that is not blank (JSONL allows blank lines between records).
template <typename Fn>
void for_each_line(const std::string& text, Fn fn) {
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    fn(line, line_no);
  }
}

const std::string& string_field(const json& rec, const std::string& key, const std::string& where) {
  INGOT_CHECK(rec.contains(key), where, ": missing field \"", key, "\"");
  INGOT_CHECK(rec[key].is_string(), where, ": field \"", key, "\" must be a string, got ", rec[key].type_name());
  return rec[key].get_ref<const std::string&>();
}

struct Builder {
  const Tokenizer& tok;
  const SourceOptions& opts;
  std::vector<Example> out;

  // A document: `prompt` (masked, may be empty) followed by `text` (trained).
  void add_document(const std::string& prompt, const std::string& text) {
    Example ex;
    auto append = [&](const std::vector<int32_t>& ids, bool train) {
      ex.ids.insert(ex.ids.end(), ids.begin(), ids.end());
      if (train) ex.labels.insert(ex.labels.end(), ids.begin(), ids.end());
      else ex.labels.insert(ex.labels.end(), ids.size(), kIgnoreIndex);
    };
    if (opts.add_bos && tok.bos_id()) append({*tok.bos_id()}, prompt.empty());
    if (!prompt.empty()) append(tok.encode(prompt), false);
    append(tok.encode(text), true);
    if (opts.add_eos && tok.eos_id()) append({*tok.eos_id()}, true);
    out.push_back(std::move(ex));
  }
};

std::vector<Example> load_token_rows(const std::string& path, const SourceOptions& opts) {
  INGOT_CHECK(opts.row_tokens >= 2, path, ": token rows need at least 2 ids a row, got ", opts.row_tokens);
  const std::string bytes = read_file(path);
  const size_t row_bytes = static_cast<size_t>(opts.row_tokens) * sizeof(int32_t);
  INGOT_CHECK(!bytes.empty() && bytes.size() % row_bytes == 0, path, ": ", bytes.size(),
              " bytes are not whole rows of ", opts.row_tokens, " int32 token ids (data.seq_len + 1 a row)");
  const size_t rows = bytes.size() / row_bytes;
  std::vector<Example> out(rows);
  for (size_t r = 0; r < rows; ++r) {
    Example& ex = out[r];
    ex.ids.resize(static_cast<size_t>(opts.row_tokens));
    std::memcpy(ex.ids.data(), bytes.data() + r * row_bytes, row_bytes);
    for (size_t i = 0; i < ex.ids.size(); ++i)
      INGOT_CHECK(ex.ids[i] >= 0 && (opts.vocab_size <= 0 || ex.ids[i] < opts.vocab_size), path, ": row ", r,
                  ", token ", i, " is id ", ex.ids[i], ", outside the vocabulary [0, ", opts.vocab_size, ")");
    ex.labels = ex.ids;
  }
  return out;
}

}  // namespace

DatasetFormat parse_dataset_format(const std::string& name) {
  if (name == "text") return DatasetFormat::Text;
  if (name == "jsonl") return DatasetFormat::Jsonl;
  if (name == "instruction") return DatasetFormat::Instruction;
  if (name == "tokens") return DatasetFormat::Tokens;
  if (name == "token_rows") return DatasetFormat::TokenRows;
  INGOT_FAIL("dataset format \"", name, "\" is not known; expected one of text, jsonl, instruction, tokens, token_rows");
}

std::vector<Example> load_examples(const std::string& path, const Tokenizer& tok, const SourceOptions& opts) {
  if (opts.format == DatasetFormat::TokenRows) return load_token_rows(path, opts);
  if (opts.format == DatasetFormat::Tokens) {
    TokenShard s = read_token_shard(path);
    INGOT_CHECK(!s.tokens.empty(), path, ": the token shard is empty");
    Example ex;
    ex.labels = s.tokens;
    ex.ids = std::move(s.tokens);
    std::vector<Example> out;
    out.push_back(std::move(ex));
    return out;
  }
  std::string text = read_file(path);
  INGOT_CHECK(text.find_first_not_of(" \t\r\n") != std::string::npos, path, ": the file is empty");
  Builder b{tok, opts, {}};
  switch (opts.format) {
    case DatasetFormat::Tokens:
    case DatasetFormat::TokenRows:
      break;
    case DatasetFormat::Text:
      INGOT_CHECK(unicode::is_valid_utf8(text), path, ": not valid UTF-8 text");
      if (opts.text_split == TextSplit::File) b.add_document("", text);
      else for_each_line(text, [&](std::string_view line, size_t) { b.add_document("", std::string(line)); });
      break;
    case DatasetFormat::Jsonl:
    case DatasetFormat::Instruction: {
      std::optional<ChatTemplate> tmpl = opts.chat_template;
      for_each_line(text, [&](std::string_view line, size_t line_no) {
        std::string where = path + ":" + std::to_string(line_no);
        json rec;
        try {
          rec = json::parse(line);
        } catch (const json::parse_error& e) {
          INGOT_FAIL(where, ": malformed JSON: ", e.what());
        }
        INGOT_CHECK(rec.is_object(), where, ": expected a JSON object, got ", rec.type_name());
        if (opts.format == DatasetFormat::Jsonl) {
          if (!rec.contains(opts.text_field) && rec.contains("prompt") && rec.contains("completion"))
            b.add_document(string_field(rec, "prompt", where), string_field(rec, "completion", where));
          else
            b.add_document("", string_field(rec, opts.text_field, where));
          return;
        }
        std::vector<ChatMessage> msgs;
        if (rec.contains("messages")) {
          INGOT_CHECK(rec["messages"].is_array() && !rec["messages"].empty(), where,
                      ": field \"messages\" must be a non-empty array");
          for (size_t i = 0; i < rec["messages"].size(); ++i) {
            const json& m = rec["messages"][i];
            std::string mwhere = where + ": messages[" + std::to_string(i) + "]";
            INGOT_CHECK(m.is_object(), mwhere, ": expected an object with role and content");
            msgs.push_back({string_field(m, "role", mwhere), string_field(m, "content", mwhere)});
          }
        } else {
          INGOT_CHECK(rec.contains("instruction") || rec.contains("output"), where,
                      ": expected alpaca fields (instruction, input, output) or a \"messages\" list");
          std::string user = string_field(rec, "instruction", where);
          if (rec.contains("input")) {
            const std::string& input = string_field(rec, "input", where);
            if (!input.empty()) user += "\n\n" + input;
          }
          msgs.push_back({"user", user});
          msgs.push_back({"assistant", string_field(rec, "output", where)});
        }
        if (!tmpl) tmpl = ChatTemplate::detect(tok);
        try {
          TokenizedChat tc = tokenize_chat(tok, *tmpl, msgs);
          b.out.push_back({std::move(tc.ids), std::move(tc.labels)});
        } catch (const Error& e) {
          INGOT_FAIL(where, ": ", e.what());
        }
      });
      break;
    }
  }
  INGOT_CHECK(!b.out.empty(), path, ": no examples (every line is blank)");
  return std::move(b.out);
}

}  // namespace ingot::recipes::datasets
