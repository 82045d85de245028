// Text <-> token ids with Hugging Face tokenizer files, matching transformers' fast tokenizers id for id:
//   - byte-level BPE (GPT-2, Llama 3, Qwen2/3): pre-tokenizer regexes through PCRE2, bytes mapped to printable
//     characters, merges by rank;
//   - SentencePiece-style BPE (Llama 2, Mistral): U+2581 for spaces (normalizer or Metaspace), byte fallback
//     to <0xNN> tokens;
//   - added tokens (special or not) split out of the text before normalization, BOS/EOS from the
//     post-processor when add_special_tokens is asked for, decoders that invert the encoding so that
//     decode(encode(s)) == s.
// Encoding caches the ids of each pre-tokenized word (text is Zipfian, so most words hit), which makes it fast.
//
// Usage:
//   Tokenizer tok = Tokenizer::from_dir("data/tokenizers/llama3");
//   std::vector<int32_t> ids = tok.encode("Hello world", {.add_special_tokens = true});
//   std::string text = tok.decode(ids, {.skip_special_tokens = true});
//
// A Tokenizer is cheap to copy (shared immutable state plus a shared cache) and safe to use from several
// threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ingot::recipes {

// An entry of tokenizer.json's "added_tokens": matched in the raw text before anything else.
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;      // control token (BOS, EOS, <|im_start|>...): skipped by skip_special_tokens
  bool lstrip = false;       // swallows whitespace on its left
  bool rstrip = false;       // swallows whitespace on its right
  bool single_word = false;  // only matches as a whole word
};

struct EncodeOptions {
  // Add the post-processor's tokens (e.g. Llama 2's <s>); what transformers' encode() does by default.
  bool add_special_tokens = false;
  // Special tokens written in the text become their ids. Turn off for untrusted text, so that a user typing
  // "<|im_end|>" gets ordinary tokens (transformers' split_special_tokens=True). Non-special added tokens are
  // always split out.
  bool parse_special = true;
};

struct DecodeOptions {
  bool skip_special_tokens = false;
  // transformers' clean_up_tokenization (" ." -> ".", " n't" -> "n't", ...). nullopt: the
  // clean_up_tokenization_spaces of tokenizer_config.json (false when absent). Breaks decode(encode(s)) == s.
  std::optional<bool> clean_up_tokenization_spaces;
};

class Tokenizer {
 public:
  // A tokenizer.json; tokenizer_config.json in the same directory, when present, supplies the BOS/EOS/PAD
  // names, the chat template and decode's clean-up default. Throws ingot::Error naming the file on a missing
  // or malformed file or on a stage type that is not implemented.
  static Tokenizer from_file(const std::string& tokenizer_json);
  // From the texts of tokenizer.json and (optionally, "" for none) tokenizer_config.json; `name` is used in
  // error messages.
  static Tokenizer from_json(const std::string& tokenizer_json, const std::string& config_json,
                             const std::string& name);
  // GPT-2's vocab.json + merges.txt (the same bytes as OpenAI's encoder.json + vocab.bpe); equals
  // GPT2TokenizerFast built from those files, with <|endoftext|> as a special token.
  static Tokenizer from_gpt2_files(const std::string& vocab_json, const std::string& merges_txt);
  // A directory holding tokenizer.json, or vocab.json + merges.txt, or encoder.json + vocab.bpe.
  static Tokenizer from_dir(const std::string& dir);

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts = {}) const;
  // Throws on an id outside the vocabulary. Bytes that do not form valid UTF-8 (a cut multi-byte character)
  // decode to U+FFFD, as transformers does.
  std::string decode(std::span<const int32_t> ids, const DecodeOptions& opts = {}) const;

  // One past the largest id (model vocabulary and added tokens).
  int64_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Throws on an unknown id.
  std::string id_to_token(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;
  bool is_special(int32_t id) const;

  // Ids of tokenizer_config.json's bos_token / eos_token / pad_token (nullopt when not configured).
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  // The Jinja chat template of tokenizer_config.json ("" when none); see chat.h for rendering.
  const std::string& chat_template() const;
  const std::string& name() const;
  // Number of cached words (for tests and statistics).
  size_t cache_size() const;

 private:
  struct Impl;
  struct Cache;
  std::shared_ptr<const Impl> impl_;
  std::shared_ptr<Cache> cache_;
};

}  // namespace ingot::recipes
