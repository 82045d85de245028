#include "recipes/registry.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "recipes/recipe_list.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

namespace {

fs::path executable_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

std::string first_comment_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("#", 0) != 0) break;
    size_t start = line.find_first_not_of("# ");
    if (start != std::string::npos) return line.substr(start);
  }
  return "";
}

// The raw `recipe:` of a config file without a full parse (`ingot ls` lists files that may not validate).
std::string recipe_in_file(const std::string& path) {
  try {
    Config c = Config::load(path);
    if (c.has("recipe") && !c.value("recipe").is_null && !c.value("recipe").is_sequence)
      return c.value("recipe").text;
  } catch (const ConfigError&) {
    return "?";
  }
  return "pretrain";
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

}  // namespace

std::string closest_name(std::string_view name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, name.size() / 3) + 1;
  for (const std::string& c : candidates)
    if (size_t d = edit_distance(name, c); d < best_d) best_d = d, best = c;
  return best;
}

const std::vector<Recipe>& all_recipes() {
  static const std::vector<Recipe> recipes = make_recipe_list();
  return recipes;
}

const Recipe* find_recipe(std::string_view name) {
  for (const Recipe& r : all_recipes())
    if (r.name == name) return &r;
  return nullptr;
}

const Recipe& recipe_of(const Config& cfg) {
  if (!cfg.has("recipe")) return *find_recipe("pretrain");
  const Config::Value& v = cfg.value("recipe");
  if (!v.is_null && !v.is_sequence)
    if (const Recipe* r = find_recipe(v.text)) return *r;
  std::string names, hint;
  size_t best = 4;
  for (const Recipe& r : all_recipes()) {
    names += (names.empty() ? "" : ", ") + r.name;
    size_t d = edit_distance(v.text, r.name);
    if (d < best) {
      best = d;
      hint = r.name;
    }
  }
  cfg.fail("recipe", "unknown recipe '" + v.text + "'" + (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                         " (recipes: " + names + ")");
}

Config load_and_check(const std::string& path, const std::vector<std::string>& edits, const Recipe** recipe_out) {
  Config cfg = Config::load(path);
  for (const std::string& e : edits) {
    if (!e.empty() && e[0] == '~')
      cfg.remove(std::string_view(e).substr(1));
    else
      cfg.apply_override(e);
  }
  const Recipe& recipe = recipe_of(cfg);
  ConfigErrors errors;
  cfg.validate(recipe.schema(), errors);
  recipe.check(cfg, errors);
  errors.raise_if_any();
  if (recipe_out) *recipe_out = &recipe;
  return cfg;
}

std::vector<std::string> builtin_config_dirs() {
  std::vector<std::string> dirs;
  std::error_code ec;
  auto add = [&](const fs::path& p) {
    if (p.empty() || !fs::is_directory(p, ec)) return;
    std::string s = fs::weakly_canonical(p, ec).string();
    if (std::find(dirs.begin(), dirs.end(), s) == dirs.end()) dirs.push_back(s);
  };
  if (const char* env = std::getenv("INGOT_CONFIG_PATH")) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ':'))
      if (!item.empty()) add(item);
  }
  fs::path exe = executable_dir();
  if (!exe.empty()) {
    add(exe.parent_path() / "share" / "ingot" / "configs");
    fs::path up = exe;
    for (int i = 0; i < 3 && up.has_parent_path() && up != up.parent_path(); ++i) {
      up = up.parent_path();
      if (fs::is_regular_file(up / "configs" / "quickstart.yaml", ec)) {
        add(up / "configs");
        break;
      }
    }
  }
  return dirs;
}

std::vector<BuiltinConfig> list_builtin_configs() {
  std::vector<BuiltinConfig> out;
  std::set<std::string> seen;
  std::error_code ec;
  for (const std::string& dir : builtin_config_dirs()) {
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file(ec) && e.path().extension() == ".yaml") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& p : files) {
      std::string name = p.stem().string();
      if (!seen.insert(name).second) continue;
      out.push_back({name, p.string(), recipe_in_file(p.string()), first_comment_line(p.string())});
    }
  }
  return out;
}

std::string resolve_config_argument(std::string_view arg_view, std::string* how) {
  std::string arg(arg_view);
  std::error_code ec;
  if (how) how->clear();
  if (fs::is_regular_file(arg, ec)) return arg;
  const bool plain_name = arg.find('/') == std::string::npos;
  if (plain_name) {
    std::string stem = arg.size() > 5 && arg.ends_with(".yaml") ? arg.substr(0, arg.size() - 5) : arg;
    std::vector<BuiltinConfig> configs = list_builtin_configs();
    for (const BuiltinConfig& c : configs)
      if (c.name == stem) {
        if (how) *how = "built-in config '" + c.name + "'";
        return c.path;
      }
    if (find_recipe(stem)) {
      const BuiltinConfig* first = nullptr;
      std::string others;
      for (const BuiltinConfig& c : configs) {
        if (c.recipe != stem) continue;
        if (!first) first = &c;
        else others += (others.empty() ? "" : ", ") + c.name;
      }
      if (first) {
        if (how)
          *how = "recipe '" + stem + "': its built-in config '" + first->name + "'" +
                 (others.empty() ? "" : " (also: " + others + ")");
        return first->path;
      }
    }
  }
  std::string dirs;
  for (const std::string& d : builtin_config_dirs()) dirs += (dirs.empty() ? "" : ", ") + d;
  if (fs::exists(arg, ec)) throw ConfigError(arg + ": is not a regular file");
  std::string hint;
  if (plain_name) {
    std::vector<std::string> names;
    for (const BuiltinConfig& c : list_builtin_configs()) names.push_back(c.name);
    for (const Recipe& r : all_recipes()) names.push_back(r.name);
    const std::string stem = arg.size() > 5 && arg.ends_with(".yaml") ? arg.substr(0, arg.size() - 5) : arg;
    if (std::string best = closest_name(stem, names); !best.empty()) hint = "; did you mean '" + best + "'?";
  }
  throw ConfigError(arg + ": cannot open config file: no such file" +
                    (plain_name ? ", built-in config or recipe" + hint + " (searched " +
                                      (dirs.empty() ? "no directory" : dirs) + "; `ingot ls` lists them)"
                                : std::string()));
}

}  // namespace ingot::recipes
