#include "recipes/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <tuple>

namespace ingot::recipes {

namespace {

std::string single_quoted(std::string_view s) {
  std::string out(1, '\'');
  out.append(s);
  out.push_back('\'');
  return out;
}

std::string describe(const Config::Value& v) {
  if (v.is_null) return "null (no value)";
  if (v.is_sequence) return "a list";
  return single_quoted(v.text);
}

// A schema default "[a, b]" as a sequence value (items are plain words; no quoting).
Config::Value parse_flow_list(std::string_view text) {
  Config::Value v;
  v.is_sequence = true;
  std::string_view body = text;
  if (body.size() >= 2 && body.front() == '[' && body.back() == ']') body = body.substr(1, body.size() - 2);
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    std::string_view item = body.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    size_t a = item.find_first_not_of(' '), b = item.find_last_not_of(' ');
    if (a != std::string_view::npos) v.items.emplace_back(item.substr(a, b - a + 1));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return v;
}

// The value an absent key takes.
Config::Value default_value(const ConfigKey& k) {
  if (k.type == ConfigType::StringList) return parse_flow_list(k.default_value);
  Config::Value v;
  v.text = k.default_value;
  return v;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<int64_t> parse_int(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_float(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s.front()))) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(std::string_view s) {
  std::string l = lower(s);
  if (l == "true" || l == "yes" || l == "on") return true;
  if (l == "false" || l == "no" || l == "off") return false;
  return std::nullopt;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string_view last_component(std::string_view path) {
  size_t dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

ConfigOrigin origin_at(const std::string& file, const YAML::Mark& m) {
  ConfigOrigin o;
  o.file = file;
  o.line = m.line + 1;
  o.column = m.column + 1;
  return o;
}

// Turns a YAML scalar, null or flow sequence of scalars into a Value; `path` names it in errors.
Config::Value to_value(const YAML::Node& node, const ConfigOrigin& origin, const std::string& path) {
  Config::Value v;
  v.origin = origin;
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: v.is_null = true; return v;
    case YAML::NodeType::Scalar: v.text = node.Scalar(); return v;
    case YAML::NodeType::Sequence:
      v.is_sequence = true;
      for (const YAML::Node& item : node) {
        if (!item.IsScalar())
          throw ConfigError(origin.str() + ": " + path + ": list items must be plain values, not lists or mappings");
        v.items.push_back(item.Scalar());
      }
      return v;
    case YAML::NodeType::Map: break;
  }
  throw ConfigError(origin.str() + ": " + path + ": expected a value, got a mapping");
}

void flatten(const YAML::Node& map, const std::string& prefix, const std::string& file,
             std::map<std::string, Config::Value, std::less<>>& out) {
  for (const auto& kv : map) {
    // Node handles are cheap references; copies keep them alive past the iterator's temporary.
    YAML::Node key = kv.first;
    YAML::Node val = kv.second;
    ConfigOrigin key_origin = origin_at(file, key.Mark());
    if (!key.IsScalar() || key.Scalar().empty())
      throw ConfigError(key_origin.str() + ": keys must be non-empty plain names");
    std::string path = prefix.empty() ? key.Scalar() : prefix + "." + key.Scalar();
    if (val.IsMap()) {
      flatten(val, path, file, out);
      continue;
    }
    ConfigOrigin val_origin = val.IsNull() ? key_origin : origin_at(file, val.Mark());
    if (auto prev = out.find(path); prev != out.end())
      throw ConfigError(key_origin.str() + ": duplicate key '" + path + "' (first set at " +
                        prev->second.key_origin.str() + ")");
    Config::Value v = to_value(val, val_origin, path);
    v.key_origin = key_origin;
    out.emplace(path, std::move(v));
  }
}

bool valid_key_path(std::string_view k) {
  if (k.empty() || k.front() == '.' || k.back() == '.' || k.find("..") != std::string_view::npos) return false;
  return std::all_of(k.begin(), k.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

// Names other frameworks use for our keys (the last component of a path) and for our choices: a typo's
// edit distance does not find them ("learning_rate" is far from "lr").
const std::map<std::string, std::string, std::less<>>& key_aliases() {
  static const std::map<std::string, std::string, std::less<>> m = {
      {"learning_rate", "lr"},          {"max_lr", "lr"},
      {"min_learning_rate", "min_lr"},  {"lr_min", "min_lr"},
      {"warmup", "warmup_steps"},       {"num_warmup_steps", "warmup_steps"},
      {"scheduler", "lr_schedule"},     {"lr_scheduler_type", "lr_schedule"},
      {"wd", "weight_decay"},           {"max_grad_norm", "grad_clip"},
      {"clip_grad_norm", "grad_clip"},  {"gradient_clipping", "grad_clip"},
      {"batch", "batch_size"},          {"per_device_train_batch_size", "batch_size"},
      {"micro_batch_size", "batch_size"}, {"grad_accum", "gradient_accumulation_steps"},
      {"gradient_accumulation", "gradient_accumulation_steps"}, {"num_train_epochs", "epochs"},
      {"steps", "max_steps"},           {"num_steps", "max_steps"},
      {"total_steps", "max_steps"},     {"max_iters", "max_steps"},
      {"precision", "dtype"},           {"torch_dtype", "dtype"},
      {"out_dir", "output_dir"},        {"output_path", "output_dir"},
      {"max_seq_len", "seq_len"},       {"max_length", "seq_len"},
      {"seq_length", "seq_len"},        {"n_layers", "n_layer"},
      {"num_layers", "n_layer"},        {"num_heads", "n_head"},
      {"n_heads", "n_head"},            {"hidden_size", "n_embd"},
      {"context_length", "block_size"}, {"r", "rank"},
      {"lora_r", "rank"},               {"lora_alpha", "alpha"},
      {"lora_dropout", "dropout"},      {"save_steps", "save_every"},
      {"logging_steps", "log_every"},   {"eval_steps", "eval_every"},
      {"torch_compile", "enabled"},
  };
  return m;
}

const std::map<std::string, std::string, std::less<>>& value_aliases() {
  static const std::map<std::string, std::string, std::less<>> m = {
      {"bfloat16", "bf16"}, {"float32", "f32"}, {"fp32", "f32"}, {"float", "f32"}, {"torch.bfloat16", "bf16"},
      {"torch.float32", "f32"}, {"cos", "cosine"}, {"const", "constant"}, {"cudagraphs", "reduce-overhead"},
  };
  return m;
}

// The choice a value most likely meant ("" when none is close): an alias, or a choice within 2 edits.
std::string suggest_choice(const std::string& value, const std::vector<std::string>& choices) {
  std::string v = lower(value);
  if (auto it = value_aliases().find(v); it != value_aliases().end() &&
                                         std::find(choices.begin(), choices.end(), it->second) != choices.end())
    return it->second;
  std::string best;
  size_t best_d = 3;
  for (const std::string& c : choices)
    if (size_t d = edit_distance(v, c); d < best_d) best_d = d, best = c;
  return best;
}

}  // namespace

std::string ConfigOrigin::str() const {
  if (!override_text.empty()) return "command-line override '" + override_text + "'";
  if (file.empty()) return "default";
  if (line == 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

std::string_view config_type_name(ConfigType t) {
  switch (t) {
    case ConfigType::Int: return "integer";
    case ConfigType::Float: return "number";
    case ConfigType::Bool: return "boolean";
    case ConfigType::String: return "string";
    case ConfigType::StringList: return "list";
  }
  return "?";
}

// --- ConfigKey / ConfigSchema ------------------------------------------------------------------------------

ConfigKey ConfigKey::of(ConfigType type, std::string path, std::string default_value, std::string help) {
  ConfigKey k;
  k.type = type;
  k.path = std::move(path);
  k.default_value = std::move(default_value);
  k.help = std::move(help);
  return k;
}

ConfigKey ConfigKey::required_key(ConfigType type, std::string path, std::string help) {
  ConfigKey k = of(type, std::move(path), "", std::move(help));
  k.required = true;
  return k;
}

ConfigKey ConfigKey::at_least(double v) const {
  ConfigKey k = *this;
  k.min = v;
  return k;
}

ConfigKey ConfigKey::at_most(double v) const {
  ConfigKey k = *this;
  k.max = v;
  return k;
}

ConfigKey ConfigKey::one_of(std::vector<std::string> allowed) const {
  ConfigKey k = *this;
  k.choices = std::move(allowed);
  return k;
}

ConfigKey ConfigKey::not_in_config_hash() const {
  ConfigKey k = *this;
  k.in_config_hash = false;
  return k;
}

ConfigSchema& ConfigSchema::add(ConfigKey key) {
  INGOT_INTERNAL_CHECK(find(key.path) == nullptr, "duplicate schema key ", key.path);
  INGOT_INTERNAL_CHECK(key.required || !key.default_value.empty() || key.type == ConfigType::String, "schema key ",
                       key.path, " needs a default or required = true");
  keys_.push_back(std::move(key));
  return *this;
}

const ConfigKey* ConfigSchema::find(std::string_view path) const {
  for (const ConfigKey& k : keys_)
    if (k.path == path) return &k;
  return nullptr;
}

std::string ConfigSchema::suggest(std::string_view path) const {
  std::string best;
  size_t best_d = std::max<size_t>(2, path.size() / 3) + 1;
  const auto alias = key_aliases().find(lower(last_component(path)));
  const std::string section(path.substr(0, path.size() - last_component(path).size()));
  for (const ConfigKey& k : keys_) {
    size_t d = edit_distance(lower(path), lower(k.path));
    // The right name in the wrong section ("lr" for "train.lr") is as good as a one-letter typo; another
    // framework's name for it ("learning_rate") too, and better in the same section.
    if (last_component(path) == last_component(k.path)) d = std::min<size_t>(d, 1);
    if (alias != key_aliases().end() && alias->second == last_component(k.path))
      d = std::min<size_t>(d, k.path.rfind(section, 0) == 0 ? 0 : 1);
    if (d < best_d) {
      best_d = d;
      best = k.path;
    }
  }
  return best;
}

std::string ConfigSchema::help() const {
  std::vector<std::string> types;
  size_t w_path = 0, w_type = 0;
  for (const ConfigKey& k : keys_) {
    std::string t(config_type_name(k.type));
    t += k.required ? " (required)" : " = " + (k.default_value.empty() ? std::string("''") : k.default_value);
    w_path = std::max(w_path, k.path.size());
    w_type = std::max(w_type, t.size());
    types.push_back(std::move(t));
  }
  std::ostringstream os;
  for (size_t i = 0; i < keys_.size(); ++i) {
    const ConfigKey& k = keys_[i];
    os << "  " << std::left << std::setw(static_cast<int>(w_path)) << k.path << "  "
       << std::setw(static_cast<int>(w_type)) << types[i] << "  " << k.help;
    if (!k.choices.empty()) {
      os << " [";
      for (size_t c = 0; c < k.choices.size(); ++c) os << (c ? "|" : "") << k.choices[c];
      os << "]";
    }
    os << "\n";
  }
  return os.str();
}

// --- Config ------------------------------------------------------------------------------------------------

Config Config::parse(const std::string& yaml_text, const std::string& file) {
  Config c;
  c.file_ = file;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(origin_at(file, e.mark).str() + ": invalid YAML: " + e.msg);
  }
  if (root.IsNull()) return c;
  if (!root.IsMap())
    throw ConfigError(origin_at(file, root.Mark()).str() + ": expected a mapping of keys at the top level");
  try {
    flatten(root, "", file, c.values_);
  } catch (const YAML::Exception& e) {
    throw ConfigError(origin_at(file, e.mark).str() + ": invalid YAML: " + e.msg);
  }
  return c;
}

Config Config::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open config file: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ConfigError(path + ": cannot read config file");
  return parse(ss.str(), path);
}

void Config::apply_override(std::string_view assignment) {
  std::string text(assignment);
  size_t eq = assignment.find('=');
  if (eq == std::string_view::npos)
    throw ConfigError("command-line override '" + text + "': expected key=value (for example train.lr=3e-4)");
  std::string key(assignment.substr(0, eq));
  std::string raw(assignment.substr(eq + 1));
  ConfigOrigin o;
  o.override_text = text;
  if (!valid_key_path(key))
    throw ConfigError(o.str() + ": '" + key + "' is not a key path (expected names joined by '.', e.g. train.lr)");
  YAML::Node node;
  try {
    node = YAML::Load(raw);
  } catch (const YAML::Exception& e) {
    throw ConfigError(o.str() + ": invalid value: " + e.msg);
  }
  Value v = to_value(node, o, key);
  v.key_origin = o;
  // An override replaces the key and anything below it (overriding a section with a value).
  for (auto it = values_.lower_bound(key); it != values_.end() && it->first.rfind(key, 0) == 0;) {
    if (it->first.size() == key.size() || it->first[key.size()] == '.')
      it = values_.erase(it);
    else
      ++it;
  }
  values_[key] = std::move(v);
}

Config Config::defaults(const ConfigSchema& schema) {
  Config c;
  for (const ConfigKey& k : schema.keys())
    if (!k.required) c.values_.emplace(k.path, default_value(k));
  c.schema_ = std::make_shared<const ConfigSchema>(schema);
  return c;
}

void Config::validate(const ConfigSchema& schema) {
  ConfigErrors errors;
  validate(schema, errors);
  errors.raise_if_any();
}

void Config::validate(const ConfigSchema& schema, ConfigErrors& errors) {
  schema_ = std::make_shared<const ConfigSchema>(schema);
  auto add_error = [&](const ConfigOrigin& o, const std::string& msg, const std::string& key) {
    errors.add(o, msg, key);
  };
  for (const auto& [path, v] : values_) {
    if (schema.find(path)) continue;
    std::string msg = "unknown key '" + path + "'";
    std::string hint = schema.suggest(path);
    if (!hint.empty()) {
      msg += "; did you mean '" + hint + "'?";
    } else {
      for (const ConfigKey& k : schema.keys()) {
        if (k.path.rfind(path + ".", 0) == 0) {
          msg += "; '" + path + "' is a section, set its keys instead (e.g. " + k.path + ")";
          break;
        }
      }
    }
    // The recipe's own key list: `ingot run --help` alone lists pretrain's.
    const ConfigKey* recipe = schema.find("recipe");
    const std::string help = recipe ? "ingot run " + recipe->default_value + " --help" : "ingot run --help";
    add_error(v.key_origin, msg + " (`" + help + "` lists every key)", path);
  }
  for (const ConfigKey& k : schema.keys()) {
    auto it = values_.find(k.path);
    if (it == values_.end()) {
      if (k.required) {
        ConfigOrigin o;
        o.file = file_;
        add_error(o, "missing required key '" + k.path + "': " + k.help, k.path);
        continue;
      }
      it = values_.emplace(k.path, default_value(k)).first;
    }
    try {
      switch (k.type) {
        case ConfigType::Int: {
          double v = static_cast<double>(get_int(k.path));
          if ((k.min && v < *k.min) || (k.max && v > *k.max)) {
            std::ostringstream bound;
            if (k.min && k.max)
              bound << "between " << *k.min << " and " << *k.max;
            else if (k.min)
              bound << ">= " << *k.min;
            else
              bound << "<= " << *k.max;
            fail(k.path, "expected an integer " + bound.str() + ", got " + describe(it->second));
          }
          break;
        }
        case ConfigType::Float: {
          double v = get_double(k.path);
          if ((k.min && v < *k.min) || (k.max && v > *k.max)) {
            std::ostringstream bound;
            if (k.min && k.max)
              bound << "between " << *k.min << " and " << *k.max;
            else if (k.min)
              bound << ">= " << *k.min;
            else
              bound << "<= " << *k.max;
            fail(k.path, "expected a number " + bound.str() + ", got " + describe(it->second));
          }
          break;
        }
        case ConfigType::Bool: get_bool(k.path); break;
        case ConfigType::StringList: get_string_list(k.path); break;
        case ConfigType::String: {
          std::string s = get_string(k.path);
          if (!k.choices.empty() && std::find(k.choices.begin(), k.choices.end(), s) == k.choices.end()) {
            std::string list;
            for (const std::string& c : k.choices) list += (list.empty() ? "" : ", ") + c;
            std::string hint = suggest_choice(s, k.choices);
            fail(k.path, "expected one of " + list + ", got " + describe(it->second) +
                             (hint.empty() ? "" : "; did you mean '" + hint + "'?"));
          }
          break;
        }
      }
    } catch (const ConfigError& e) {
      errors.add_exception(k.path, it->second.origin, e);
    }
  }
}

// --- ConfigReader ------------------------------------------------------------------------------------------

ConfigReader::ConfigReader(const Config& cfg, ConfigErrors& errors) : cfg_(cfg), errors_(errors) {
  INGOT_INTERNAL_CHECK(cfg.schema(), "ConfigReader: the config was not validated against a schema");
}

bool ConfigReader::listed(std::string_view key) const { return cfg_.schema()->find(key) != nullptr; }

template <class T, class Getter>
T ConfigReader::read(std::string_view key, ConfigType type, Getter getter) const {
  const ConfigKey* k = cfg_.schema()->find(key);
  INGOT_INTERNAL_CHECK(k, "ConfigReader: '", key, "' is read but the schema does not list it");
  INGOT_INTERNAL_CHECK(k->type == type, "ConfigReader: '", key, "' is read as type '", config_type_name(type),
                       "' but the schema declares '", config_type_name(k->type), "'");
  cfg_.read_keys_.emplace(key);
  try {
    return (cfg_.*getter)(key);
  } catch (const ConfigError& e) {
    errors_.add_exception(key, cfg_.has(key) ? cfg_.origin(key) : ConfigOrigin{}, e);
  }
  // The run is refused already; the default only keeps later checks from reporting follow-on mistakes. A
  // required key has none, so the type's empty value stands in.
  if (k->required) return T{};
  const Config d = Config::defaults(*cfg_.schema());
  return (d.*getter)(key);
}

int64_t ConfigReader::i64(std::string_view key) const { return read<int64_t>(key, ConfigType::Int, &Config::get_int); }
double ConfigReader::f64(std::string_view key) const { return read<double>(key, ConfigType::Float, &Config::get_double); }
bool ConfigReader::flag(std::string_view key) const { return read<bool>(key, ConfigType::Bool, &Config::get_bool); }
std::string ConfigReader::str(std::string_view key) const {
  return read<std::string>(key, ConfigType::String, &Config::get_string);
}
std::vector<std::string> ConfigReader::list(std::string_view key) const {
  return read<std::vector<std::string>>(key, ConfigType::StringList, &Config::get_string_list);
}

void Config::remove(std::string_view path) {
  std::string key(path);
  bool found = false;
  for (auto it = values_.lower_bound(key); it != values_.end() && it->first.rfind(key, 0) == 0;) {
    if (it->first.size() == key.size() || it->first[key.size()] == '.') {
      it = values_.erase(it);
      found = true;
    } else {
      ++it;
    }
  }
  if (!found)
    throw ConfigError("command-line '~" + key + "': the config does not set '" + key +
                      "' (nothing to remove; `ingot cat` shows what it sets)");
}

// --- ConfigErrors ------------------------------------------------------------------------------------------

void ConfigErrors::add(const ConfigOrigin& where, const std::string& message, std::string key) {
  // An origin with no file and no override (an environment variable, a checkpoint) adds no prefix.
  bool placeless = where.file.empty() && where.override_text.empty();
  std::string text = placeless ? message : where.str() + ": " + message;
  for (const Entry& e : errors_)
    if (e.text == text) return;
  errors_.push_back({where, std::move(key), std::move(text)});
}

void ConfigErrors::fail(const Config& cfg, std::string_view path, const std::string& message) {
  ConfigOrigin where;
  if (cfg.has(path)) {
    where = cfg.origin(path);
  } else {
    where.file = cfg.file();
  }
  add(where, std::string(path) + ": " + message, std::string(path));
}

void ConfigErrors::add_exception(std::string_view key, const ConfigOrigin& where, const ConfigError& e) {
  if (has_error_for(key)) return;
  Entry entry{where, std::string(key), e.what()};  // ConfigError messages already start with the origin
  errors_.push_back(std::move(entry));
}

bool ConfigErrors::has_error_for(std::string_view key) const {
  for (const Entry& e : errors_)
    if (!e.key.empty() && e.key == key) return true;
  return false;
}

std::vector<std::string> ConfigErrors::messages() const {
  std::vector<const Entry*> sorted;
  for (const Entry& e : errors_) sorted.push_back(&e);
  // File positions first, in order; overrides and defaults (line 0) after them, as recorded.
  std::stable_sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
    auto rank = [](const Entry* e) { return e->where.line == 0 ? INT32_MAX : e->where.line; };
    return std::make_tuple(rank(a), a->where.column) < std::make_tuple(rank(b), b->where.column);
  });
  std::vector<std::string> out;
  for (const Entry* e : sorted) out.push_back(e->text);
  return out;
}

void ConfigErrors::raise_if_any() const {
  if (errors_.empty()) return;
  std::string msg;
  for (const std::string& m : messages()) msg += (msg.empty() ? "" : "\n") + m;
  if (errors_.size() > 1) msg = std::to_string(errors_.size()) + " config errors:\n" + msg;
  throw ConfigError(msg);
}

bool Config::has(std::string_view path) const { return values_.find(path) != values_.end(); }

const Config::Value& Config::value(std::string_view path) const {
  auto it = values_.find(path);
  if (it == values_.end())
    throw ConfigError((file_.empty() ? std::string("config") : file_) + ": missing key '" + std::string(path) + "'");
  return it->second;
}

const ConfigOrigin& Config::origin(std::string_view path) const { return value(path).origin; }

void Config::fail(std::string_view path, const std::string& message) const {
  auto it = values_.find(path);
  std::string where = it != values_.end() ? it->second.origin.str() : (file_.empty() ? "config" : file_);
  throw ConfigError(where + ": " + std::string(path) + ": " + message);
}

int64_t Config::get_int(std::string_view path) const {
  const Value& v = value(path);
  std::optional<int64_t> r;
  if (!v.is_null && !v.is_sequence) r = parse_int(v.text);
  if (!r) fail(path, "expected an integer, got " + describe(v));
  return *r;
}

double Config::get_double(std::string_view path) const {
  const Value& v = value(path);
  std::optional<double> r;
  if (!v.is_null && !v.is_sequence) r = parse_float(v.text);
  if (!r) fail(path, "expected a number, got " + describe(v));
  return *r;
}

bool Config::get_bool(std::string_view path) const {
  const Value& v = value(path);
  std::optional<bool> r;
  if (!v.is_null && !v.is_sequence) r = parse_bool(v.text);
  if (!r) fail(path, "expected true or false, got " + describe(v));
  return *r;
}

std::string Config::get_string(std::string_view path) const {
  const Value& v = value(path);
  if (v.is_null || v.is_sequence) fail(path, "expected a string, got " + describe(v));
  return v.text;
}

std::vector<std::string> Config::get_string_list(std::string_view path) const {
  const Value& v = value(path);
  if (v.is_null) fail(path, "expected a list, got " + describe(v));
  return v.is_sequence ? v.items : std::vector<std::string>{v.text};
}

std::string Config::to_yaml() const {
  YAML::Node root(YAML::NodeType::Map);
  for (const auto& [path, v] : values_) {
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      size_t dot = path.find('.', start);
      parts.push_back(path.substr(start, dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    // yaml-cpp node handles are references: walk down by reassigning a handle to each child.
    std::vector<YAML::Node> chain{root};
    for (size_t i = 0; i + 1 < parts.size(); ++i) chain.push_back(chain.back()[parts[i]]);
    YAML::Node leaf;
    if (v.is_null) {
      leaf = YAML::Node(YAML::NodeType::Null);
    } else if (v.is_sequence) {
      leaf = YAML::Node(YAML::NodeType::Sequence);
      for (const std::string& item : v.items) leaf.push_back(item);
      leaf.SetStyle(YAML::EmitterStyle::Flow);
    } else {
      leaf = YAML::Node(v.text);
    }
    chain.back()[parts.back()] = leaf;
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace ingot::recipes
