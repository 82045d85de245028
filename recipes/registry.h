// The recipes `ingot` knows, and where its built-in configs live.
//
// A config names its recipe with the top-level `recipe:` key (default: pretrain). Built-in configs are the
// *.yaml files of the first existing directory among, in order:
//   1. each directory in $INGOT_CONFIG_PATH (colon-separated), all of them searched
//   2. <prefix>/share/ingot/configs, where the binary is <prefix>/bin/ingot (an installed layout:
//      `cmake --install` puts configs there)
//   3. <source>/configs, where the binary lives in a build directory inside the source tree
//      (<source>/<build>/bin/ingot, found by walking up at most three levels to a directory holding
//      configs/quickstart.yaml)
// Every directory found is searched (earlier ones win on equal names).
#pragma once

#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "recipes/config.h"

namespace ingot::recipes {

struct Recipe {
  std::string name;
  std::string description;  // one line for `ingot ls`
  std::function<const ConfigSchema&()> schema;
  // Semantic checks beyond the schema (files exist, sizes agree...); records every problem in `errors`.
  std::function<void(const Config&, ConfigErrors&)> check;
  // Runs a validated config, progress to `log`; returns the run summary as JSON text.
  std::function<std::string(const Config&, std::ostream& log)> run;
};

const std::vector<Recipe>& all_recipes();
const Recipe* find_recipe(std::string_view name);
// The recipe a (not yet validated) config asks for: its `recipe:` value, or "pretrain". An unknown name is a
// ConfigError at the key's origin, with a did-you-mean.
const Recipe& recipe_of(const Config& cfg);

// Loads, applies `key=value` overrides and `~key` removals, validates against the recipe's schema and runs
// its semantic checks; every problem is reported at once in one ConfigError.
Config load_and_check(const std::string& path, const std::vector<std::string>& edits, const Recipe** recipe_out);

struct BuiltinConfig {
  std::string name;         // file name without .yaml
  std::string path;         // full path
  std::string recipe;       // its `recipe:` (pretrain when absent)
  std::string description;  // the first comment line of the file
};

// The candidate closest to a misspelled `name` (within a third of its length in edits, at least 2), or "".
std::string closest_name(std::string_view name, const std::vector<std::string>& candidates);

std::vector<std::string> builtin_config_dirs();
std::vector<BuiltinConfig> list_builtin_configs();
// A CONFIG argument as a file path: an existing file as is; otherwise a built-in config name ("quickstart"
// or "quickstart.yaml"), or a recipe name (its first built-in config). Throws ConfigError listing the
// directories searched when nothing matches. `how`, when given, receives what a name resolved to ("" for a
// file path), for the run's banner: "built-in config 'quickstart'" or "recipe 'lora_finetune': its built-in
// config 'llama_lora_finetune' (also: qwen2_lora_finetune)".
std::string resolve_config_argument(std::string_view arg, std::string* how = nullptr);

}  // namespace ingot::recipes
