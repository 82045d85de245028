#include "recipes/tokenizer/bpe.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <queue>

#include "recipes/tokenizer/unicode.h"
#include "runtime/error.h"

namespace ingot::recipes {

namespace {
uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581
}  // namespace

BpeModel BpeModel::from_json(const nlohmann::json& m, const std::string& where) {
  INGOT_CHECK(m.is_object() && m.value("type", std::string("BPE")) == "BPE", where,
              ": model: expected a BPE model, got type ", m.is_object() ? m.value("type", std::string("?")) : "?");
  INGOT_CHECK(m.contains("vocab") && m["vocab"].is_object(), where, ": model.vocab: expected an object");
  INGOT_CHECK(m.contains("merges") && m["merges"].is_array(), where, ": model.merges: expected an array");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && m[key].is_string())
      INGOT_CHECK(m[key].get<std::string>().empty(), where, ": model.", key, " = \"", m[key].get<std::string>(),
                  "\" is not supported (only empty or null)");
  }
  INGOT_CHECK(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"].get<double>() == 0.0, where,
              ": model.dropout is not supported (tokenization must be deterministic)");
  BpeModel bpe;
  bpe.vocab_.reserve(m["vocab"].size());
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it)
    bpe.vocab_.emplace(it.key(), it.value().get<int32_t>());
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(m["merges"].size());
  for (const auto& mg : m["merges"]) {
    // Older files store "a b", newer ones ["a", "b"] (which allows spaces inside the parts).
    if (mg.is_string()) {
      const std::string& s = mg.get_ref<const std::string&>();
      size_t sp = s.find(' ', 1);
      INGOT_CHECK(sp != std::string::npos, where, ": model.merges: entry \"", s, "\" is not two tokens");
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      INGOT_CHECK(mg.is_array() && mg.size() == 2, where, ": model.merges: expected \"a b\" or [a, b], got ",
                  mg.dump());
      merges.emplace_back(mg[0].get<std::string>(), mg[1].get<std::string>());
    }
  }
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = bpe.vocab_.find(m["unk_token"].get<std::string>());
    INGOT_CHECK(it != bpe.vocab_.end(), where, ": model.unk_token ", m["unk_token"].dump(), " is not in the vocab");
    bpe.unk_ = it->second;
  }
  bpe.fuse_unk_ = m.value("fuse_unk", false);
  bpe.byte_fallback_ = m.value("byte_fallback", false);
  bpe.ignore_merges_ = m.value("ignore_merges", false);
  bpe.finish(merges, where);
  return bpe;
}

BpeModel BpeModel::from_vocab_merges(std::unordered_map<std::string, int32_t> vocab,
                                     const std::vector<std::pair<std::string, std::string>>& merges,
                                     const std::string& where) {
  BpeModel bpe;
  bpe.vocab_ = std::move(vocab);
  bpe.finish(merges, where);
  return bpe;
}

void BpeModel::finish(const std::vector<std::pair<std::string, std::string>>& merges, const std::string& where) {
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab_) {
    INGOT_CHECK(id >= 0, where, ": vocab: token ", tok, " has negative id ", id);
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(size_t(max_id + 1), std::string());
  has_id_.assign(size_t(max_id + 1), false);
  for (const auto& [tok, id] : vocab_) {
    INGOT_CHECK(!has_id_[id], where, ": vocab: id ", id, " is used by both \"", id_to_token_[id], "\" and \"", tok,
                "\"");
    id_to_token_[id] = tok;
    has_id_[id] = true;
  }
  merges_.reserve(merges.size());
  metaspace_splittable_ = true;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    INGOT_CHECK(ia != vocab_.end() && ib != vocab_.end(), where, ": merge ", r, " (\"", a, "\", \"", b,
                "\") uses a token missing from the vocab");
    INGOT_CHECK(ic != vocab_.end(), where, ": merge ", r, " (\"", a, "\", \"", b, "\") makes \"", a + b,
                "\", which is missing from the vocab");
    merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(int32_t(r), ic->second));
    // A merge result holding U+2581 right after another character would join text across a word start.
    const std::string merged = a + b;
    for (size_t p = merged.find(kMetaspace, 1); p != std::string::npos; p = merged.find(kMetaspace, p + 1))
      if (p < 3 || merged.compare(p - 3, 3, kMetaspace) != 0) metaspace_splittable_ = false;
  }
  if (byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = vocab_.find(name);
      byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
    }
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Initial symbols, one per character (or per byte under byte fallback).
  std::vector<int32_t> sym;
  sym.reserve(word.size());
  bool last_unk = false;
  std::string ch;
  for (size_t i = 0; i < word.size();) {
    size_t n = std::min(unicode::utf8_len(static_cast<unsigned char>(word[i])), word.size() - i);
    ch.assign(word.substr(i, n));
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      sym.push_back(it->second);
      last_unk = false;
    } else {
      bool bytes_ok = byte_fallback_;
      for (size_t k = 0; bytes_ok && k < n; ++k) bytes_ok = byte_ids_[static_cast<unsigned char>(word[i + k])] >= 0;
      if (bytes_ok) {
        for (size_t k = 0; k < n; ++k) sym.push_back(byte_ids_[static_cast<unsigned char>(word[i + k])]);
        last_unk = false;
      } else {
        INGOT_CHECK(unk_.has_value(), "tokenizer: character \"", ch,
                    "\" is not in the vocabulary and the model has no unk_token or byte fallback");
        if (!(fuse_unk_ && last_unk)) sym.push_back(*unk_);
        last_unk = true;
      }
    }
    i += n;
  }
  const size_t n = sym.size();
  if (n > 1) {
    // Doubly linked symbols; a heap of candidate merges ordered by (rank, position). Entries made stale by an
    // earlier merge are recognised on pop and skipped.
    std::vector<int32_t> prev(n), next(n);
    std::vector<bool> alive(n, true);
    for (size_t i = 0; i < n; ++i) {
      prev[i] = int32_t(i) - 1;
      next[i] = i + 1 < n ? int32_t(i + 1) : -1;
    }
    struct Cand {
      int32_t rank, pos, merged;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int32_t pos) {
      if (pos < 0 || next[pos] < 0) return;
      auto it = merges_.find(pair_key(sym[pos], sym[next[pos]]));
      if (it != merges_.end()) heap.push({it->second.first, pos, it->second.second});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
    while (!heap.empty()) {
      Cand c = heap.top();
      heap.pop();
      if (!alive[c.pos] || next[c.pos] < 0) continue;
      int32_t right = next[c.pos];
      auto it = merges_.find(pair_key(sym[c.pos], sym[right]));
      if (it == merges_.end() || it->second.second != c.merged || it->second.first != c.rank) continue;
      sym[c.pos] = c.merged;
      alive[right] = false;
      next[c.pos] = next[right];
      if (next[right] >= 0) prev[next[right]] = c.pos;
      push(prev[c.pos]);
      push(c.pos);
    }
    for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
    return;
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

}  // namespace ingot::recipes
