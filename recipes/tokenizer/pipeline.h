// The stages of a tokenizer.json around the BPE model, built from their JSON objects: normalizer (text ->
// text), pre-tokenizer (text -> words), post-processor (ids -> ids with BOS/EOS) and decoder (tokens ->
// text). Each implements the subset of HF tokenizers' types that the GPT-2, Llama 2/3, Mistral and Qwen2/3
// files use; any other type is rejected when the file is read, naming the file and the type.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "recipes/tokenizer/regex.h"

namespace ingot::recipes {

// Types: Sequence, NFC, Prepend, Replace (String or Regex pattern).
struct Normalizer {
  enum class Kind { Sequence, Nfc, Prepend, Replace };
  Kind kind = Kind::Sequence;
  std::string text, content;  // Prepend: text; Replace: text (literal pattern) -> content
  std::shared_ptr<Regex> regex;  // Replace with a Regex pattern
  std::vector<Normalizer> children;

  // `j` may be null (no normalizer). `where` names the file for errors.
  static Normalizer from_json(const nlohmann::json& j, const std::string& where);
  void apply(std::string& s) const;
};

// Types: Sequence, Split (Regex or String; Isolated, Removed, MergedWithPrevious, MergedWithNext; invert),
// ByteLevel (add_prefix_space, use_regex with the GPT-2 pattern), Metaspace (replacement, prepend_scheme
// always/first/never or the older add_prefix_space, split).
struct PreTokenizer {
  enum class Kind { Sequence, Split, ByteLevel, Metaspace };
  enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext };
  enum class Prepend { Always, First, Never };
  Kind kind = Kind::Sequence;
  std::shared_ptr<Regex> regex;  // Split / ByteLevel with use_regex
  std::string literal;           // Split with a String pattern
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;
  std::string replacement;
  Prepend prepend = Prepend::Always;
  bool split = true;
  std::vector<PreTokenizer> children;

  static PreTokenizer from_json(const nlohmann::json& j, const std::string& where);
  // Splits each of `words` further (in place). `at_start`: the words begin the encoded text (Metaspace's
  // prepend_scheme "first").
  void apply(std::vector<std::string>& words, bool at_start) const;
};

// Types: TemplateProcessing (single template), ByteLevel (ids unchanged), RobertaProcessing /
// BertProcessing (cls A sep), Sequence.
struct PostProcessor {
  std::vector<int32_t> prefix, suffix;  // special ids around the single sequence

  static PostProcessor from_json(const nlohmann::json& j, const std::string& where);
};

// Types: Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip.
struct Decoder {
  enum class Kind { Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip };
  Kind kind = Kind::Fuse;
  std::string text, content;
  int start = 0, stop = 0;
  bool prepend = true;  // Metaspace: drop the leading space the encoder added
  std::vector<Decoder> children;

  static Decoder from_json(const nlohmann::json& j, const std::string& where);
  void apply(std::vector<std::string>& tokens) const;
};

}  // namespace ingot::recipes
