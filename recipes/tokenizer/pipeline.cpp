#include "recipes/tokenizer/pipeline.h"

#include <nlohmann/json.hpp>

#include "recipes/tokenizer/unicode.h"
#include "runtime/error.h"

namespace ingot::recipes {

namespace {

using nlohmann::json;

// The pattern HF's ByteLevel pre-tokenizer uses when use_regex is true (GPT-2's).
const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string type_of(const json& j, const std::string& where, const char* stage) {
  INGOT_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), where, ": ", stage,
              ": expected an object with a \"type\", got ", j.dump().substr(0, 200));
  return j["type"].get<std::string>();
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty() || s.find(from) == std::string::npos) return;
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out += to;
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

// A Split/Replace "pattern": {"String": "..."} or {"Regex": "..."}.
void read_pattern(const json& p, const std::string& where, const char* stage, std::string& literal,
                  std::shared_ptr<Regex>& regex) {
  INGOT_CHECK(p.is_object() && (p.contains("String") || p.contains("Regex")), where, ": ", stage,
              ".pattern: expected {\"String\": ...} or {\"Regex\": ...}, got ", p.dump());
  if (p.contains("Regex")) {
    try {
      regex = std::make_shared<Regex>(p["Regex"].get<std::string>());
    } catch (const Error& e) {
      INGOT_FAIL(where, ": ", stage, ": ", e.what());
    }
  } else {
    literal = p["String"].get<std::string>();
  }
}

std::vector<std::pair<size_t, size_t>> literal_matches(std::string_view s, const std::string& lit) {
  std::vector<std::pair<size_t, size_t>> out;
  if (lit.empty()) return out;
  for (size_t pos = 0; (pos = s.find(lit, pos)) != std::string_view::npos; pos += lit.size())
    out.emplace_back(pos, pos + lit.size());
  return out;
}

// Cuts `s` at `matches` (sorted, non-overlapping) the way HF's SplitDelimiterBehavior does.
void split_by(std::string_view s, std::vector<std::pair<size_t, size_t>> matches, PreTokenizer::Behavior behavior,
              bool invert, std::vector<std::string>& out) {
  using B = PreTokenizer::Behavior;
  // Label every byte range as match (true) or gap (false), in order.
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> parts;
  size_t pos = 0;
  for (auto [b, e] : matches) {
    if (b > pos) parts.push_back({{pos, b}, invert});
    parts.push_back({{b, e}, !invert});
    pos = e;
  }
  if (pos < s.size()) parts.push_back({{pos, s.size()}, invert});
  std::string pending;  // MergedWithNext: matches waiting for the next part
  bool prev_open = false;
  for (size_t k = 0; k < parts.size(); ++k) {
    auto [range, is_match] = parts[k];
    std::string_view piece = s.substr(range.first, range.second - range.first);
    switch (behavior) {
      case B::Isolated:
        out.emplace_back(piece);
        break;
      case B::Removed:
        if (!is_match) out.emplace_back(piece);
        break;
      case B::MergedWithPrevious:
        if (is_match && prev_open)
          out.back().append(piece);
        else
          out.emplace_back(piece);
        prev_open = true;
        break;
      case B::MergedWithNext:
        if (is_match) {
          if (!pending.empty()) {
            out.push_back(std::move(pending));
            pending.clear();
          }
          pending.assign(piece);
        } else {
          out.push_back(pending + std::string(piece));
          pending.clear();
        }
        break;
    }
  }
  if (!pending.empty()) out.push_back(std::move(pending));
}

}  // namespace

Normalizer Normalizer::from_json(const json& j, const std::string& where) {
  Normalizer n;
  if (j.is_null()) return n;  // an empty Sequence: identity
  std::string t = type_of(j, where, "normalizer");
  if (t == "Sequence") {
    for (const auto& c : j.at("normalizers")) n.children.push_back(from_json(c, where));
  } else if (t == "NFC") {
    n.kind = Kind::Nfc;
  } else if (t == "Prepend") {
    n.kind = Kind::Prepend;
    n.text = j.at("prepend").get<std::string>();
  } else if (t == "Replace") {
    n.kind = Kind::Replace;
    read_pattern(j.at("pattern"), where, "normalizer Replace", n.text, n.regex);
    n.content = j.at("content").get<std::string>();
  } else {
    INGOT_FAIL(where, ": normalizer type \"", t, "\" is not supported (supported: Sequence, NFC, Prepend, Replace)");
  }
  return n;
}

void Normalizer::apply(std::string& s) const {
  switch (kind) {
    case Kind::Sequence:
      for (const auto& c : children) c.apply(s);
      break;
    case Kind::Nfc:
      s = unicode::nfc(s);
      break;
    case Kind::Prepend:
      if (!s.empty()) s.insert(0, text);  // HF prepends only to non-empty text
      break;
    case Kind::Replace:
      if (regex) {
        std::string out;
        size_t pos = 0;
        for (auto [b, e] : regex->find_all(s)) {
          out.append(s, pos, b - pos);
          out += content;
          pos = e;
        }
        out.append(s, pos, std::string::npos);
        s = std::move(out);
      } else {
        replace_all(s, text, content);
      }
      break;
  }
}

PreTokenizer PreTokenizer::from_json(const json& j, const std::string& where) {
  PreTokenizer p;
  if (j.is_null()) return p;
  std::string t = type_of(j, where, "pre_tokenizer");
  if (t == "Sequence") {
    for (const auto& c : j.at("pretokenizers")) p.children.push_back(from_json(c, where));
  } else if (t == "Split") {
    p.kind = Kind::Split;
    read_pattern(j.at("pattern"), where, "pre_tokenizer Split", p.literal, p.regex);
    std::string b = j.value("behavior", std::string("Isolated"));
    if (b == "Isolated") p.behavior = Behavior::Isolated;
    else if (b == "Removed") p.behavior = Behavior::Removed;
    else if (b == "MergedWithPrevious") p.behavior = Behavior::MergedWithPrevious;
    else if (b == "MergedWithNext") p.behavior = Behavior::MergedWithNext;
    else INGOT_FAIL(where, ": pre_tokenizer Split behavior \"", b, "\" is not supported");
    p.invert = j.value("invert", false);
  } else if (t == "ByteLevel") {
    p.kind = Kind::ByteLevel;
    p.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) p.regex = std::make_shared<Regex>(kGpt2Pattern);
  } else if (t == "Metaspace") {
    p.kind = Kind::Metaspace;
    p.replacement = j.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = j.contains("prepend_scheme") ? j["prepend_scheme"].get<std::string>()
                                                      : (j.value("add_prefix_space", true) ? "always" : "never");
    if (scheme == "always") p.prepend = Prepend::Always;
    else if (scheme == "first") p.prepend = Prepend::First;
    else if (scheme == "never") p.prepend = Prepend::Never;
    else INGOT_FAIL(where, ": pre_tokenizer Metaspace prepend_scheme \"", scheme, "\" is not one of always, first, never");
    p.split = j.value("split", true);
  } else {
    INGOT_FAIL(where, ": pre_tokenizer type \"", t,
               "\" is not supported (supported: Sequence, Split, ByteLevel, Metaspace)");
  }
  return p;
}

void PreTokenizer::apply(std::vector<std::string>& words, bool at_start) const {
  if (kind == Kind::Sequence) {
    for (const auto& c : children) c.apply(words, at_start);
    return;
  }
  std::vector<std::string> out;
  out.reserve(words.size() * 2);
  for (size_t w = 0; w < words.size(); ++w) {
    std::string& s = words[w];
    switch (kind) {
      case Kind::Sequence:
        break;
      case Kind::Split:
        split_by(s, regex ? regex->find_all(s) : literal_matches(s, literal), behavior, invert, out);
        break;
      case Kind::ByteLevel: {
        if (add_prefix_space && !s.starts_with(' ')) s.insert(0, " ");
        std::vector<std::string> pieces;
        if (regex)
          split_by(s, regex->find_all(s), Behavior::Isolated, false, pieces);
        else
          pieces.push_back(std::move(s));
        const auto& map = unicode::byte_to_char();
        for (const std::string& piece : pieces) {
          std::string mapped;
          mapped.reserve(piece.size() * 2);
          for (unsigned char c : piece) mapped += map[c];
          out.push_back(std::move(mapped));
        }
        break;
      }
      case Kind::Metaspace: {
        std::string t = s;
        if (replacement != " ") {
          size_t pos = 0;
          std::string r;
          for (size_t hit; (hit = t.find(' ', pos)) != std::string::npos; pos = hit + 1) r.append(t, pos, hit - pos) += replacement;
          r.append(t, pos, std::string::npos);
          t = std::move(r);
        }
        bool add = prepend == Prepend::Always || (prepend == Prepend::First && at_start && w == 0);
        if (add && !t.starts_with(replacement)) t.insert(0, replacement);
        if (split)
          split_by(t, literal_matches(t, replacement), Behavior::MergedWithNext, false, out);
        else
          out.push_back(std::move(t));
        break;
      }
    }
  }
  words = std::move(out);
}

PostProcessor PostProcessor::from_json(const json& j, const std::string& where) {
  PostProcessor p;
  if (j.is_null()) return p;
  std::string t = type_of(j, where, "post_processor");
  if (t == "ByteLevel") return p;  // changes offsets only
  if (t == "Sequence") {
    for (const auto& c : j.at("processors")) {
      PostProcessor q = from_json(c, where);
      // Each processor wraps what the previous ones produced.
      p.prefix.insert(p.prefix.begin(), q.prefix.begin(), q.prefix.end());
      p.suffix.insert(p.suffix.end(), q.suffix.begin(), q.suffix.end());
    }
    return p;
  }
  if (t == "RobertaProcessing" || t == "BertProcessing") {
    p.prefix.push_back(j.at("cls").at(1).get<int32_t>());
    p.suffix.push_back(j.at("sep").at(1).get<int32_t>());
    return p;
  }
  INGOT_CHECK(t == "TemplateProcessing", where, ": post_processor type \"", t,
              "\" is not supported (supported: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, "
              "Sequence)");
  const json& specials = j.at("special_tokens");
  bool seen_sequence = false;
  for (const auto& item : j.at("single")) {
    if (item.contains("Sequence")) {
      INGOT_CHECK(!seen_sequence, where, ": post_processor.single: more than one Sequence item");
      seen_sequence = true;
      continue;
    }
    INGOT_CHECK(item.contains("SpecialToken"), where, ": post_processor.single: unexpected item ", item.dump());
    std::string name = item["SpecialToken"].at("id").get<std::string>();
    INGOT_CHECK(specials.contains(name), where, ": post_processor: special token \"", name,
                "\" is missing from special_tokens");
    for (const auto& id : specials[name].at("ids")) (seen_sequence ? p.suffix : p.prefix).push_back(id.get<int32_t>());
  }
  INGOT_CHECK(seen_sequence, where, ": post_processor.single has no Sequence item");
  return p;
}

Decoder Decoder::from_json(const json& j, const std::string& where) {
  Decoder d;
  if (j.is_null()) return d;  // Fuse: tokens concatenated
  std::string t = type_of(j, where, "decoder");
  if (t == "Sequence") {
    d.kind = Kind::Sequence;
    for (const auto& c : j.at("decoders")) d.children.push_back(from_json(c, where));
  } else if (t == "ByteLevel") {
    d.kind = Kind::ByteLevel;
  } else if (t == "Metaspace") {
    d.kind = Kind::Metaspace;
    d.text = j.value("replacement", std::string("\xE2\x96\x81"));
    d.prepend = j.contains("prepend_scheme") ? j["prepend_scheme"].get<std::string>() != "never"
                                             : j.value("add_prefix_space", true);
  } else if (t == "Replace") {
    d.kind = Kind::Replace;
    std::shared_ptr<Regex> re;
    read_pattern(j.at("pattern"), where, "decoder Replace", d.text, re);
    INGOT_CHECK(!re, where, ": decoder Replace with a Regex pattern is not supported");
    d.content = j.at("content").get<std::string>();
  } else if (t == "ByteFallback") {
    d.kind = Kind::ByteFallback;
  } else if (t == "Fuse") {
    d.kind = Kind::Fuse;
  } else if (t == "Strip") {
    d.kind = Kind::Strip;
    d.text = j.at("content").get<std::string>();
    d.start = j.value("start", 0);
    d.stop = j.value("stop", 0);
  } else {
    INGOT_FAIL(where, ": decoder type \"", t,
               "\" is not supported (supported: Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip)");
  }
  return d;
}

void Decoder::apply(std::vector<std::string>& tokens) const {
  switch (kind) {
    case Kind::Sequence:
      for (const auto& c : children) c.apply(tokens);
      break;
    case Kind::ByteLevel: {
      // A token with a character outside the byte map (an added token such as "<|im_start|>" is plain ASCII
      // and maps to itself; others keep their UTF-8 bytes) is copied as is, as HF does.
      std::string bytes;
      for (const std::string& tok : tokens) {
        size_t mark = bytes.size();
        bool ok = true;
        for (size_t i = 0; i < tok.size() && ok;) {
          size_t n = unicode::utf8_len(static_cast<unsigned char>(tok[i]));
          uint32_t cp = static_cast<unsigned char>(tok[i]);
          if (n == 2 && i + 1 < tok.size()) cp = ((cp & 0x1F) << 6) | (static_cast<unsigned char>(tok[i + 1]) & 0x3F);
          int b = n <= 2 ? unicode::char_to_byte(cp) : -1;
          if (b < 0) ok = false;
          else bytes += char(b);
          i += n;
        }
        if (!ok) {
          bytes.resize(mark);
          bytes += tok;
        }
      }
      tokens.assign(1, unicode::to_valid_utf8(bytes));
      break;
    }
    case Kind::Metaspace:
      for (size_t i = 0; i < tokens.size(); ++i) {
        replace_all(tokens[i], text, " ");
        if (i == 0 && prepend && tokens[i].starts_with(' ')) tokens[i].erase(0, 1);
      }
      break;
    case Kind::Replace:
      for (auto& tok : tokens) replace_all(tok, text, content);
      break;
    case Kind::ByteFallback: {
      std::vector<std::string> out;
      std::string pending;
      auto flush = [&] {
        if (pending.empty()) return;
        if (unicode::is_valid_utf8(pending)) out.push_back(pending);
        else
          for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
        pending.clear();
      };
      for (auto& tok : tokens) {
        if (tok.size() == 6 && tok.starts_with("<0x") && tok.back() == '>' && std::isxdigit(uint8_t(tok[3])) &&
            std::isxdigit(uint8_t(tok[4]))) {
          pending += char(std::stoi(tok.substr(3, 2), nullptr, 16));
        } else {
          flush();
          out.push_back(std::move(tok));
        }
      }
      flush();
      tokens = std::move(out);
      break;
    }
    case Kind::Fuse: {
      std::string all;
      for (const auto& tok : tokens) all += tok;
      tokens.assign(1, std::move(all));
      break;
    }
    case Kind::Strip:
      for (auto& tok : tokens) {
        for (int k = 0; k < start && tok.starts_with(text); ++k) tok.erase(0, text.size());
        for (int k = 0; k < stop && tok.ends_with(text); ++k) tok.resize(tok.size() - text.size());
      }
      break;
  }
}

}  // namespace ingot::recipes
