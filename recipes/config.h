// Recipe configs: a YAML file plus `key=value` command-line overrides, checked against a schema.
//
// A config is held flat, as dotted key paths ("train.lr") mapped to values that remember where they came
// from (file:line:column, or the override text), so every error names the key and the place to fix it:
//   configs/quickstart.yaml:9:7: train.lr: expected a number, got 'fast'
// The schema lists every key a recipe reads, with its type, default, bounds and help; it drives validation
// (unknown keys get a "did you mean"), defaults, and `ingot run --help`.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"

namespace ingot::recipes {

// A config mistake (bad YAML, unknown key, wrong type, out of range). The CLI maps it to exit code 2.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(what) {}
};

// Where a value was written.
struct ConfigOrigin {
  std::string file;           // the YAML file, empty for a command-line override
  int line = 0, column = 0;   // 1-based, in the YAML file
  std::string override_text;  // "train.lr=3e-4" for a command-line override
  std::string str() const;    // "configs/q.yaml:9:7" or "command-line override 'train.lr=3e-4'"
};

// StringList: a YAML list of plain values ([q_proj, v_proj]); a single value is a one-item list. Its default
// is written as a flow list ("[q_proj, v_proj]").
enum class ConfigType { Int, Float, Bool, String, StringList };
std::string_view config_type_name(ConfigType t);  // "integer", "number", "boolean", "string", "list"

// One key a recipe reads.
struct ConfigKey {
  std::string path;  // "train.lr"
  ConfigType type = ConfigType::String;
  std::string default_value;  // as YAML text; empty with required = true means no default
  std::string help;           // one line for `ingot run --help`
  bool required = false;
  std::vector<std::string> choices;  // allowed values of a String key (empty: any)
  std::optional<double> min, max;    // inclusive bounds of an Int/Float key
  // Whether the value enters the config hash a resume checks (recipes/train_state.h); false for keys that do
  // not change what a step computes (where a run writes, how often it logs or saves, how it runs).
  bool in_config_hash = true;

  // Builders: ConfigKey::of(ConfigType::Int, "train.batch_size", "8", "sequences per step").at_least(1).
  static ConfigKey of(ConfigType type, std::string path, std::string default_value, std::string help);
  static ConfigKey required_key(ConfigType type, std::string path, std::string help);
  ConfigKey at_least(double v) const;
  ConfigKey at_most(double v) const;
  ConfigKey one_of(std::vector<std::string> allowed) const;
  ConfigKey not_in_config_hash() const;
};

class ConfigSchema {
 public:
  ConfigSchema& add(ConfigKey key);
  const ConfigKey* find(std::string_view path) const;
  const std::vector<ConfigKey>& keys() const { return keys_; }
  // The closest known key to a misspelled one ("" when nothing is close).
  std::string suggest(std::string_view path) const;
  // One line per key: "  train.lr  number = 6e-4  peak learning rate", aligned.
  std::string help() const;

 private:
  std::vector<ConfigKey> keys_;
};

class Config;

// Collects config errors so that a run, and `ingot validate`, report every mistake at once (sorted by
// where they are written) instead of stopping at the first.
class ConfigErrors {
 public:
  // Records "<origin>: <message>" (the message usually starts with the key path).
  void add(const ConfigOrigin& where, const std::string& message, std::string key = "");
  // Records "<origin of path>: <path>: <message>", like Config::fail without throwing.
  void fail(const Config& cfg, std::string_view path, const std::string& message);
  // Records a ConfigError thrown while reading `key`; repeated errors about one key are kept once.
  void add_exception(std::string_view key, const ConfigOrigin& where, const ConfigError& e);
  bool has_error_for(std::string_view key) const;
  bool empty() const { return errors_.empty(); }
  size_t size() const { return errors_.size(); }
  std::vector<std::string> messages() const;  // sorted by file position
  // Throws one ConfigError holding every message ("3 config errors:\n..."); no-op when empty.
  void raise_if_any() const;

 private:
  struct Entry {
    ConfigOrigin where;
    std::string key, text;
  };
  std::vector<Entry> errors_;
};

// Typed reads for a settings resolver, from a config validated against its schema. A value that cannot be read
// (the schema check already reported it) is recorded in `errors` and the key's schema default returned, so one
// pass reports every mistake at once. The schema entry is the key's only definition: no read restates a
// default, and reading a key the schema does not list, or as another type than the schema's (i64 for Int,
// f64 for Float, flag for Bool, str for String, list for StringList), is an internal error.
class ConfigReader {
 public:
  // `cfg` must have been validated (Config::validate keeps its schema).
  ConfigReader(const Config& cfg, ConfigErrors& errors);
  int64_t i64(std::string_view key) const;
  double f64(std::string_view key) const;
  bool flag(std::string_view key) const;
  std::string str(std::string_view key) const;
  std::vector<std::string> list(std::string_view key) const;
  // Whether the schema lists `key`: for keys only some recipes have (model.adapter, data.packing).
  bool listed(std::string_view key) const;

 private:
  template <class T, class Getter>
  T read(std::string_view key, ConfigType type, Getter getter) const;
  const Config& cfg_;
  ConfigErrors& errors_;
};

class Config {
 public:
  struct Value {
    std::string text;  // scalar text ("3e-4", "true", "data/kjv.txt"); empty for null
    bool is_null = false;
    bool is_sequence = false;
    std::vector<std::string> items;  // scalar items of a sequence
    ConfigOrigin origin;             // where the value is written (type and range errors point here)
    ConfigOrigin key_origin;         // where its key is written (unknown-key errors point here)
  };

  Config() = default;
  // Reads and parses a YAML file whose top level is a mapping. Throws ConfigError naming the file (and line
  // and column for syntax errors, duplicate keys, or non-scalar leaves).
  static Config load(const std::string& path);
  // Parses YAML text; `file` names it in messages.
  static Config parse(const std::string& yaml_text, const std::string& file);

  // Applies "a.b=value"; the value is parsed as a YAML scalar or flow sequence ("3e-4", "true", "[1, 2]").
  void apply_override(std::string_view assignment);
  // Rejects unknown keys (with a suggestion), missing required keys, wrong types, values outside bounds or
  // choices; fills in defaults for absent keys and keeps the schema (schema()). Throws ConfigError naming the
  // key and its origin.
  void validate(const ConfigSchema& schema);
  // The same checks, recorded in `errors` instead of thrown.
  void validate(const ConfigSchema& schema, ConfigErrors& errors);
  // Removes a key, or a whole section, so its default applies (the CLI's `~key`). Removing an absent key is
  // a ConfigError naming it.
  void remove(std::string_view path);

  // The schema the config was last validated against; null before validate().
  const ConfigSchema* schema() const { return schema_.get(); }
  // A config holding the schema's defaults (required keys are absent): what a validated config is before any
  // value is written.
  static Config defaults(const ConfigSchema& schema);

  bool has(std::string_view path) const;
  const Value& value(std::string_view path) const;  // throws ConfigError when absent
  // Every key a ConfigReader has read from this config, so tests can check that each key a schema declares
  // is read by its recipe.
  const std::set<std::string, std::less<>>& read_keys() const { return read_keys_; }
  int64_t get_int(std::string_view path) const;
  double get_double(std::string_view path) const;  // integers are accepted
  bool get_bool(std::string_view path) const;      // true/false/yes/no/on/off
  std::string get_string(std::string_view path) const;
  std::vector<std::string> get_string_list(std::string_view path) const;  // a list, or one value as a list
  const ConfigOrigin& origin(std::string_view path) const;
  // Throws a ConfigError "<origin>: <path>: <message>".
  [[noreturn]] void fail(std::string_view path, const std::string& message) const;

  const std::string& file() const { return file_; }
  const std::map<std::string, Value, std::less<>>& values() const { return values_; }
  // The resolved config as nested YAML (what a run actually used), for output_dir/config.yaml.
  std::string to_yaml() const;

 private:
  std::string file_;
  std::map<std::string, Value, std::less<>> values_;
  std::shared_ptr<const ConfigSchema> schema_;
  friend class ConfigReader;
  mutable std::set<std::string, std::less<>> read_keys_;
};

}  // namespace ingot::recipes
