// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}): a vocabulary, merges ranked by their order,
// and how to start a word: one symbol per character, a character missing from the vocabulary becoming its
// UTF-8 bytes as <0xNN> tokens (byte_fallback, SentencePiece-style) or the unknown token (fused when
// fuse_unk). Merging applies the lowest-ranked adjacent pair first, leftmost among equals, exactly as HF
// tokenizers' Word::merge_all does, so ids match transformers'.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ingot::recipes {

class BpeModel {
 public:
  BpeModel() = default;
  // Reads a tokenizer.json "model" object; `where` names the file for errors. Throws on a merge whose parts or
  // result are missing from the vocabulary, on a duplicate id, and on options this model does not implement.
  static BpeModel from_json(const nlohmann::json& model, const std::string& where);
  // vocab: token -> id; merges: pairs in rank order (GPT-2's vocab.json / merges.txt).
  static BpeModel from_vocab_merges(std::unordered_map<std::string, int32_t> vocab,
                                    const std::vector<std::pair<std::string, std::string>>& merges,
                                    const std::string& where);

  // Appends the ids of one pre-tokenized word (already in the model's alphabet, e.g. byte-level characters).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullptr for an id outside the vocabulary.
  const std::string* id_to_token(int32_t id) const;
  // One past the largest id.
  int64_t size() const { return int64_t(id_to_token_.size()); }
  // True when no merge result contains U+2581 after another character, so a word may be cut before each
  // run of U+2581 without changing the merges (lets SentencePiece-style text be merged word by word).
  bool metaspace_splittable() const { return metaspace_splittable_; }

 private:
  void finish(const std::vector<std::pair<std::string, std::string>>& merges, const std::string& where);

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::optional<int32_t> unk_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256] = {};
  bool metaspace_splittable_ = false;
};

}  // namespace ingot::recipes
