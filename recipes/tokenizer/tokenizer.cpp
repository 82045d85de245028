#include "recipes/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <unordered_map>

#include "recipes/tokenizer/bpe.h"
#include "recipes/tokenizer/pipeline.h"
#include "recipes/tokenizer/unicode.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::recipes {

using nlohmann::json;

struct Tokenizer::Impl {
  std::string name;
  BpeModel model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  PostProcessor post;
  Decoder decoder;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  std::unordered_map<int32_t, size_t> added_by_id;  // id -> index in `added`
  // Added tokens whose content starts with byte b, longest first (leftmost-longest matching).
  std::vector<size_t> by_first_byte[256];
  std::optional<int32_t> bos, eos, pad;
  std::string chat_template;
  bool clean_up = false;
  int64_t vocab_size = 0;

  void index_added();
  void read_config(const json& cfg);
  std::optional<int32_t> lookup(const std::string& token) const {
    auto it = added_by_content.find(token);
    if (it != added_by_content.end()) return it->second;
    return model.token_to_id(token);
  }
  void encode_section(std::string text, bool at_start, std::vector<int32_t>& out, Cache& cache) const;
};

// Word -> ids. Bounded: cleared when it outgrows kMaxEntries, so memory stays flat on endless streams.
struct Tokenizer::Cache {
  static constexpr size_t kMaxEntries = 1 << 20;
  static constexpr size_t kMaxWordBytes = 256;
  // Transparent hashing: lookups by string_view allocate nothing.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
};

namespace {

json parse_json(const std::string& text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    INGOT_FAIL(where, ": not valid JSON: ", e.what());
  }
}

// tokenizer_config.json writes a token as "text", {"content": "text", ...} or null.
std::optional<std::string> config_token(const json& cfg, const char* key) {
  if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  if (cfg[key].is_string()) return cfg[key].get<std::string>();
  if (cfg[key].is_object() && cfg[key].contains("content")) return cfg[key]["content"].get<std::string>();
  return std::nullopt;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_word_char(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }

// Cuts a SentencePiece-style word before every run of U+2581 that follows another character.
void cut_at_metaspace(std::string_view w, std::vector<std::string_view>& out) {
  static constexpr std::string_view kMeta = "\xE2\x96\x81";
  size_t start = 0;
  for (size_t p = w.find(kMeta, 1); p != std::string_view::npos; p = w.find(kMeta, p + 3)) {
    if (p >= 3 && w.compare(p - 3, 3, kMeta) == 0) continue;
    out.push_back(w.substr(start, p - start));
    start = p;
  }
  out.push_back(w.substr(start));
}

const std::string& checked_string(const json& j, const char* key, const std::string& where) {
  INGOT_CHECK(j.contains(key) && j[key].is_string(), where, ": expected a string \"", key, "\" in ", j.dump().substr(0, 200));
  return j[key].get_ref<const std::string&>();
}

}  // namespace

void Tokenizer::Impl::index_added() {
  vocab_size = model.size();
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    INGOT_CHECK(!t.content.empty(), name, ": added token ", t.id, " has empty content");
    added_by_content[t.content] = t.id;
    added_by_id[t.id] = i;
    by_first_byte[static_cast<unsigned char>(t.content[0])].push_back(i);
    vocab_size = std::max<int64_t>(vocab_size, int64_t(t.id) + 1);
  }
  for (auto& v : by_first_byte)
    std::stable_sort(v.begin(), v.end(), [&](size_t a, size_t b) { return added[a].content.size() > added[b].content.size(); });
}

void Tokenizer::Impl::read_config(const json& cfg) {
  auto id_of = [&](const char* key) -> std::optional<int32_t> {
    auto tok = config_token(cfg, key);
    if (!tok) return std::nullopt;
    auto id = lookup(*tok);
    INGOT_CHECK(id.has_value(), name, ": tokenizer_config.json: ", key, " \"", *tok, "\" is not in the vocabulary");
    return id;
  };
  bos = id_of("bos_token");
  eos = id_of("eos_token");
  pad = id_of("pad_token");
  if (cfg.contains("chat_template")) {
    const json& t = cfg["chat_template"];
    if (t.is_string()) {
      chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // [{"name": "default", "template": ...}, ...]
      for (const auto& e : t)
        if (e.value("name", std::string()) == "default") chat_template = e.value("template", std::string());
    }
  }
  clean_up = cfg.value("clean_up_tokenization_spaces", false);
  // Note [Llama tokenizer class]: a tokenizer.json is encoded with its own normalizer and pre-tokenizer, as HF
  // tokenizers (0.23) and transformers 4's fast tokenizers do. For Llama 2 and Mistral that is Prepend "▁" +
  // Replace " " -> "▁", which equals SentencePiece's dummy prefix: "  This report" becomes "▁▁▁This▁report" ->
  // ["▁▁", "▁This", "▁report"], the pieces the model was trained on. transformers 5 rebuilds a LlamaTokenizer
  // from the vocabulary alone with a Metaspace pre-tokenizer that adds no "▁" to text starting with a space,
  // dropping one "▁" there and after every special token written in the text; we do not follow it (issue 24).
  // What the config does change, as in transformers 4 and 5: BOS/EOS come from add_bos_token / add_eos_token,
  // and add_prefix_space: false drops the prepended "▁" (the normalizer becomes the Replace alone, and the
  // decoder keeps every leading space).
  std::string cls = cfg.value("tokenizer_class", std::string());
  if (cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast") {
    if (!cfg.value("add_prefix_space", true)) {
      normalizer = Normalizer{};
      pre_tokenizer = PreTokenizer::from_json({{"type", "Metaspace"}, {"prepend_scheme", "never"}, {"split", false}}, name);
      json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                   {{"type", "ByteFallback"}}, {{"type", "Fuse"}}});
      decoder = Decoder::from_json({{"type", "Sequence"}, {"decoders", decoders}}, name);
    }
    post.prefix.clear();
    post.suffix.clear();
    if (cfg.value("add_bos_token", true) && bos) post.prefix.push_back(*bos);
    if (cfg.value("add_eos_token", false) && eos) post.suffix.push_back(*eos);
  }
}

Tokenizer Tokenizer::from_json(const std::string& tokenizer_json, const std::string& config_json,
                               const std::string& name) {
  json j = parse_json(tokenizer_json, name);
  INGOT_CHECK(j.is_object() && j.contains("model"), name, ": expected a tokenizer.json object with a \"model\"");
  auto impl = std::make_shared<Impl>();
  impl->name = name;
  impl->model = BpeModel::from_json(j["model"], name);
  impl->normalizer = Normalizer::from_json(j.value("normalizer", json()), name);
  impl->pre_tokenizer = PreTokenizer::from_json(j.value("pre_tokenizer", json()), name);
  impl->post = PostProcessor::from_json(j.value("post_processor", json()), name);
  impl->decoder = Decoder::from_json(j.value("decoder", json()), name);
  if (j.contains("added_tokens")) {
    for (const auto& a : j["added_tokens"]) {
      AddedToken t;
      t.content = checked_string(a, "content", name + ": added_tokens");
      INGOT_CHECK(a.contains("id") && a["id"].is_number_integer(), name, ": added token \"", t.content,
                  "\" has no integer id");
      t.id = a["id"].get<int32_t>();
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      impl->added.push_back(std::move(t));
    }
  }
  impl->index_added();
  if (!config_json.empty()) impl->read_config(parse_json(config_json, name + " (tokenizer_config.json)"));
  Tokenizer tok;
  tok.impl_ = std::move(impl);
  tok.cache_ = std::make_shared<Cache>();
  return tok;
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::string cfg;
  auto cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) cfg = read_file(cfg_path.string());
  return from_json(read_file(path), cfg, path);
}

Tokenizer Tokenizer::from_gpt2_files(const std::string& vocab_json, const std::string& merges_txt) {
  json v = parse_json(read_file(vocab_json), vocab_json);
  INGOT_CHECK(v.is_object() && !v.empty(), vocab_json, ": expected a JSON object token -> id");
  std::unordered_map<std::string, int32_t> vocab;
  for (auto it = v.begin(); it != v.end(); ++it) {
    INGOT_CHECK(it.value().is_number_integer(), vocab_json, ": token \"", it.key(), "\" has a non-integer id");
    vocab.emplace(it.key(), it.value().get<int32_t>());
  }
  std::string text = read_file(merges_txt);
  std::vector<std::pair<std::string, std::string>> merges;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.starts_with("#version")) continue;
    size_t sp = line.find(' ');
    INGOT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
                merges_txt, ":", line_no, ": expected two tokens separated by one space, got \"", line, "\"");
    merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  auto impl = std::make_shared<Impl>();
  impl->name = vocab_json;
  impl->model = BpeModel::from_vocab_merges(std::move(vocab), merges, merges_txt);
  impl->pre_tokenizer = PreTokenizer::from_json({{"type", "ByteLevel"}, {"add_prefix_space", false}}, vocab_json);
  impl->decoder = Decoder::from_json({{"type", "ByteLevel"}}, vocab_json);
  if (auto eot = impl->model.token_to_id("<|endoftext|>")) {
    impl->added.push_back({"<|endoftext|>", *eot, true, false, false, false});
    impl->bos = impl->eos = *eot;
  }
  impl->index_added();
  Tokenizer tok;
  tok.impl_ = std::move(impl);
  tok.cache_ = std::make_shared<Cache>();
  return tok;
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path d(dir);
  if (fs::exists(d / "tokenizer.json")) return from_file((d / "tokenizer.json").string());
  if (fs::exists(d / "vocab.json") && fs::exists(d / "merges.txt"))
    return from_gpt2_files((d / "vocab.json").string(), (d / "merges.txt").string());
  if (fs::exists(d / "encoder.json") && fs::exists(d / "vocab.bpe"))
    return from_gpt2_files((d / "encoder.json").string(), (d / "vocab.bpe").string());
  INGOT_FAIL("tokenizer: ", dir,
             ": expected tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe in this directory "
             "(scripts/get_tokenizers.sh fetches the GPT-2, Llama 2/3 and Qwen3 tokenizers into data/tokenizers/)");
}

void Tokenizer::Impl::encode_section(std::string text, bool at_start, std::vector<int32_t>& out, Cache& cache) const {
  normalizer.apply(text);
  if (text.empty()) return;
  std::vector<std::string> words{std::move(text)};
  pre_tokenizer.apply(words, at_start);
  std::vector<std::string_view> parts;
  std::lock_guard<std::mutex> lock(cache.mu);
  for (const std::string& w : words) {
    parts.clear();
    if (model.metaspace_splittable())
      cut_at_metaspace(w, parts);
    else
      parts.push_back(w);
    for (std::string_view part : parts) {
      if (part.empty()) continue;
      if (part.size() > Cache::kMaxWordBytes) {
        model.encode_word(part, out);
        continue;
      }
      auto it = cache.map.find(part);
      if (it == cache.map.end()) {
        std::vector<int32_t> ids;
        model.encode_word(part, ids);
        if (cache.map.size() >= Cache::kMaxEntries) cache.map.clear();
        it = cache.map.emplace(std::string(part), std::move(ids)).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
  const Impl& im = *impl_;
  INGOT_CHECK(unicode::is_valid_utf8(text), im.name, ": encode: the text is not valid UTF-8");
  std::vector<int32_t> out(im.post.prefix.begin(), opts.add_special_tokens ? im.post.prefix.end() : im.post.prefix.begin());
  out.reserve(text.size() / 3 + 8);
  // Split out added tokens: scan for the leftmost match, longest first at a position.
  size_t section_start = 0;
  for (size_t i = 0; i < text.size();) {
    const auto& cands = im.by_first_byte[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (size_t idx : cands) {
      const AddedToken& t = im.added[idx];
      if (!opts.parse_special && t.special) continue;
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      if (t.single_word) {
        size_t e = i + t.content.size();
        if ((i > 0 && is_word_char(text[i - 1])) || (e < text.size() && is_word_char(text[e]))) continue;
      }
      hit = &t;
      break;
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t b = i, e = i + hit->content.size();
    if (hit->lstrip)
      while (b > section_start && is_space(text[b - 1])) --b;
    if (hit->rstrip)
      while (e < text.size() && is_space(text[e])) ++e;
    if (b > section_start)
      im.encode_section(std::string(text.substr(section_start, b - section_start)), section_start == 0, out, *cache_);
    out.push_back(hit->id);
    section_start = i = e;
  }
  if (section_start < text.size())
    im.encode_section(std::string(text.substr(section_start)), section_start == 0, out, *cache_);
  if (opts.add_special_tokens) out.insert(out.end(), im.post.suffix.begin(), im.post.suffix.end());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, const DecodeOptions& opts) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto a = im.added_by_id.find(id);
    if (a != im.added_by_id.end()) {
      if (opts.skip_special_tokens && im.added[a->second].special) continue;
      tokens.push_back(im.added[a->second].content);
      continue;
    }
    const std::string* t = im.model.id_to_token(id);
    INGOT_CHECK(t != nullptr, im.name, ": decode: id ", id, " is not in the vocabulary (size ", im.vocab_size, ")");
    tokens.push_back(*t);
  }
  im.decoder.apply(tokens);
  std::string text;
  for (const auto& t : tokens) text += t;
  text = unicode::to_valid_utf8(text);
  if (opts.clean_up_tokenization_spaces.value_or(im.clean_up)) {
    static const std::pair<const char*, const char*> kRules[] = {
        {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
        {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (auto [from, to] : kRules) {
      std::string f(from), r;
      size_t pos = 0;
      for (size_t hit; (hit = text.find(f, pos)) != std::string::npos; pos = hit + f.size()) r.append(text, pos, hit - pos) += to;
      r.append(text, pos, std::string::npos);
      text = std::move(r);
    }
  }
  return text;
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const { return impl_->lookup(std::string(token)); }

std::string Tokenizer::id_to_token(int32_t id) const {
  auto a = impl_->added_by_id.find(id);
  if (a != impl_->added_by_id.end()) return impl_->added[a->second].content;
  const std::string* t = impl_->model.id_to_token(id);
  INGOT_CHECK(t != nullptr, impl_->name, ": id ", id, " is not in the vocabulary (size ", impl_->vocab_size, ")");
  return *t;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

bool Tokenizer::is_special(int32_t id) const {
  auto a = impl_->added_by_id.find(id);
  return a != impl_->added_by_id.end() && impl_->added[a->second].special;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return impl_->pad; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::name() const { return impl_->name; }

size_t Tokenizer::cache_size() const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  return cache_->map.size();
}

}  // namespace ingot::recipes
