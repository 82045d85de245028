// The `ingot` program. Commands: run, ls, cat, cp, validate, explain, plot (see kMainHelp). Exit status: 0 done,
// 1 runtime error, 2 usage or config error (nothing written).
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "distributed/launch/error_file.h"
#include "recipes/config.h"
#include "recipes/plot.h"
#include "recipes/registry.h"
#include "recipes/run_settings.h"
#include "runtime/device.h"
#include "runtime/file_util.h"

#ifndef INGOT_VERSION
#define INGOT_VERSION "unknown"
#endif

namespace ingot {
int launch_main(const std::vector<std::string>& args);  // tools/launch.cpp
}  // namespace ingot

namespace {

namespace fs = std::filesystem;
namespace rc = ingot::recipes;
using rc::ConfigError;
using Args = std::vector<std::string_view>;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// Thrown for bad command lines; exit code 2 and a pointer to --help.
struct UsageError : std::exception {
  explicit UsageError(std::string m, std::string cmd = "") : msg(std::move(m)), command(std::move(cmd)) {}
  const char* what() const noexcept override { return msg.c_str(); }
  std::string msg, command;
};

constexpr const char* kMainHelp = R"(ingot: a C++20 training framework (autograd, whole-step compiler, data parallel; CPU and CUDA)

Usage:
  ingot run CONFIG [key=value ...] [~key ...] [--summary PATH]   run the recipe a config describes
  ingot ls                                                       recipes and their built-in configs
  ingot cat CONFIG                                               print a config
  ingot cp CONFIG PATH                                           copy a built-in config to edit it
  ingot validate CONFIG [key=value ...] [~key ...] [--summary P] check a config fully, without running
  ingot explain CONFIG [key=value ...] [~key ...] [--steps N]    what the compiler does with the training step
  ingot plot RUN_DIR [--out PATH]                                draw RUN_DIR/metrics.jsonl as a PNG
  ingot launch [options] -- COMMAND [ARGS ...]                   run COMMAND as N workers, torchrun style
  ingot --help | --version

CONFIG is a YAML file, a built-in config name (quickstart) or a recipe name (pretrain). Built-in configs
come from $INGOT_CONFIG_PATH, <prefix>/share/ingot/configs beside an installed bin/ingot, or the source
tree's configs/ when ingot runs from a build directory inside it.

Recipes: pretrain, full_finetune, lora_finetune (Hugging Face checkpoints), eval (perplexity), generate.

Examples:
  ingot run configs/quickstart.yaml
  ingot run quickstart max_steps=50 device=cpu --summary runs/summary.json
  ingot cp quickstart my.yaml && ingot validate my.yaml
  ingot run llama_lora_finetune && ingot run generate_text model.path=runs/llama_lora_finetune/hf

`ingot COMMAND --help` describes each command; `ingot run CONFIG --help` lists the recipe's keys.
Exit status: 0 done, 1 runtime error, 2 usage or config error.

Environment:
  INGOT_LOGS=KINDS       compiler logs on stderr, a comma list of graph, passes, recompiles, graph_breaks,
                         guards, output_code, schedule, perf, progress, memory (the step of a compiled run
                         where the device allocator held the most, and the largest values alive), or all
  INGOT_CACHE_DIR=DIR    compile cache (kernels, autotune database); default ~/.cache/ingot
  INGOT_ATTENTION=IMPL   cudnn | fallback | auto (default): the CUDA attention kernels
  INGOT_CUDNN_VERBOSE=1  print cuDNN attention engine timings
  INGOT_CONFIG_PATH=DIR  where built-in configs are looked up first
  INGOT_CXX=COMPILER     the C++ compiler for CPU kernels (else $CXX, else c++)
  INGOT_TRACE_DIR=DIR    where a timed-out collective dumps its rank's recent collectives (default /tmp)
  INGOT_GLOO_HOSTNAME=H  the address Gloo binds on this host
)";

constexpr const char* kRunHelp = R"(Usage: ingot run CONFIG [key=value ...] [~key ...] [--summary PATH]

Runs the recipe named by the config's `recipe:` key (default pretrain). Everything the config says is
checked first, and every problem is reported at once; nothing is written unless the config is valid.

Arguments:
  CONFIG            a YAML file, a built-in config name, or a recipe name (see `ingot ls`)
  key=value         sets one key, e.g. max_steps=50 train.lr=3e-4 device=cpu; the value is YAML, typed by
                    the schema like the file's values
  ~key              removes a key (or a whole section) so its default applies, e.g. ~train.min_lr
  --summary PATH    also writes the run's summary JSON to PATH (atomically, when the run ends)
  -h, --help        this help (with CONFIG: that recipe's keys)

The first line names the config file (and the built-in config a name resolved to) and the output_dir.
Progress goes to stderr, one line every train.log_every steps (loss averaged and memory peaked since the
previous line; gnorm: the gradient norm before clipping; ETA - until a compiled run's first step is done):
  step 20/300 | loss 2.345 | lr 3.0e-04 | gnorm 0.84 | 12.3k tok/s | MFU 31.2% | mem peak 1.25 GiB | ETA 0:41
output_dir receives model.safetensors, config.yaml (the resolved config), summary.json, metrics.jsonl (one
record per step; a failed run's records after its last checkpoint go to metrics.failed.jsonl), loss.png,
checkpoints/step_N/ (checkpoint.save_every), tensorboard/ (logging.tensorboard) and profile/ (profile.enabled).
resume: true continues from the newest checkpoint (none yet: starts fresh), resume_from: PATH from a given
one, and a job restarted by the launcher (INGOT_RESTART_COUNT > 0) resumes by itself; a resume with another
max_steps needs resume_schedule: keep or stretch. A fresh run into an output_dir holding an earlier run's
checkpoints is refused unless overwrite_output_dir: true.
full_finetune and lora_finetune also export output_dir/hf (config.json + safetensors + tokenizer files, what
transformers loads) and, for LoRA, output_dir/adapter (PEFT). eval prints the loss and perplexity; generate
prints the completion on stdout. Their summaries are JSON too.

Summary fields: steps, first_loss, final_loss, best_loss, val_loss, tokens_per_s, mfu, train_s, compile_s,
graphs, graph_breaks, recompiles (0 while training is eager), peak_memory_bytes, num_parameters, device,
dtype, output_dir, config, resumed_from, checkpoints, training_checkpoints, metrics_log, loss_plot, ...;
null where not measured (val_loss without eval, mfu without a device peak, compile_s of an eager run,
tokens_per_s when no step ran).

Exit status: 0 done, 1 runtime error, 2 usage or config error (nothing is written).
)";

constexpr const char* kLsHelp = R"(Usage: ingot ls

Lists the recipes and, under each, the built-in configs that run it (name and first comment line), then
the directories searched for built-in configs.
)";

constexpr const char* kCatHelp = R"(Usage: ingot cat CONFIG

Prints a config file (a path, or a built-in config name such as quickstart) to stdout.
)";

constexpr const char* kCpHelp = R"(Usage: ingot cp CONFIG PATH

Copies a config (usually a built-in one) to PATH so you can edit it. PATH may be a directory (the file
keeps its name). An existing file is not overwritten unless --force is given.
)";

constexpr const char* kValidateHelp = R"(Usage: ingot validate CONFIG [key=value ...] [~key ...] [--summary PATH]

Checks a config as `ingot run` would before its first step (YAML syntax, unknown keys with a suggestion, types,
ranges and choices, required keys, the recipe's own rules; data files present, non-empty and UTF-8; the
tokenizer and the chat template; a checkpoint to resume from and an earlier run's checkpoints in output_dir;
that output_dir, its checkpoints/ and --summary PATH can be written) without running anything, and prints ALL
problems at once, each with file:line:column and the key path.
Exit status: 0 valid, 2 invalid.
)";

constexpr const char* kExplainHelp = R"(Usage: ingot explain CONFIG [key=value ...] [~key ...] [--steps N]

Compiles the training step of a pretrain / full_finetune / lora_finetune config and reports what the compiler
did: graphs and graph breaks (reason and source line), ops before and after the passes, fusion groups,
kernels generated and reused, launches per step against eager's op count, recompiles with their reasons,
planned peak memory and compile time by phase. It runs N real training steps (default 2: the first traces
and compiles, the second runs the compiled graph) with compile.enabled=true, into a temporary output_dir
that is removed afterwards: nothing in the config's output_dir is touched. The training log goes to stderr,
the report to stdout. The config's compile.* keys (mode, dynamic, memory_budget, cache_dir...) apply.
Exit status: 0 done, 1 runtime error, 2 usage or config error.
)";

constexpr const char* kPlotHelp = R"(Usage: ingot plot RUN_DIR [--out PATH]

Draws the training loss (and validation loss, when evaluated) from RUN_DIR/metrics.jsonl into a PNG:
RUN_DIR/loss.png unless --out is given. Runs draw it by themselves at the end (logging.plot).
)";

bool is_help(std::string_view a) { return a == "-h" || a == "--help"; }

void print_version() {
#ifdef INGOT_WITH_CUDA
  const char* cuda = "yes";
#else
  const char* cuda = "no";
#endif
  std::cout << "ingot " << INGOT_VERSION << " (CUDA: " << cuda
            << ", CUDA devices visible: " << ingot::cuda_device_count() << ")\n";
}

// CONFIG then key=value / ~key edits; options are handled by the caller through `option`.
struct ConfigArgs {
  std::string config;
  std::vector<std::string> edits;
  bool help = false;
};

ConfigArgs parse_config_args(const Args& args, const std::string& cmd,
                             const std::function<bool(const Args&, size_t&)>& option = {}) {
  ConfigArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (is_help(a)) {
      out.help = true;
    } else if (option && option(args, i)) {
      continue;
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError("unknown option '" + std::string(a) + "'", cmd);
    } else if (out.config.empty()) {
      out.config = a;
    } else if (a.find('=') != std::string_view::npos || (a.size() > 1 && a[0] == '~')) {
      out.edits.emplace_back(a);
    } else {
      throw UsageError("unexpected argument '" + std::string(a) + "' (overrides look like key=value, removals ~key)",
                       cmd);
    }
  }
  return out;
}

void print_recipe_keys(const std::string& config_arg) {
  const rc::Recipe* recipe = rc::find_recipe("pretrain");
  if (!config_arg.empty()) {
    rc::Config cfg = rc::Config::load(rc::resolve_config_argument(config_arg));
    recipe = &rc::recipe_of(cfg);
  }
  std::cout << "\nConfig keys of recipe '" << recipe->name << "' (type = default):\n" << recipe->schema().help();
}

// `--summary PATH` / `--summary=PATH` for parse_config_args; why PATH cannot be written goes to `problem`
// (run refuses it before anything runs; validate reports it with the config's problems).
std::function<bool(const Args&, size_t&)> summary_option(std::string& path, std::string& problem,
                                                         const std::string& cmd) {
  return [&path, &problem, cmd](const Args& a, size_t& i) {
    if (a[i] == "--summary") {
      if (i + 1 >= a.size()) throw UsageError("--summary needs a PATH", cmd);
      path = a[++i];
    } else if (a[i].rfind("--summary=", 0) == 0) {
      path = a[i].substr(std::strlen("--summary="));
      if (path.empty()) throw UsageError("--summary needs a PATH", cmd);
    } else {
      return false;
    }
    problem = rc::output_location_problem(path, false);
    if (!problem.empty()) problem = "--summary: " + problem;
    return true;
  };
}

int run_command(const Args& args) {
  std::string summary_path, summary_problem;
  ConfigArgs ca = parse_config_args(args, "run", summary_option(summary_path, summary_problem, "run"));
  if (ca.help) {
    std::cout << kRunHelp;
    print_recipe_keys(ca.config);
    return 0;
  }
  if (ca.config.empty()) throw UsageError("missing CONFIG (a YAML file, e.g. configs/quickstart.yaml)", "run");
  if (!summary_problem.empty()) throw UsageError(summary_problem, "run");

  // Everything the config says is checked before any work starts or any file is written.
  const rc::Recipe* recipe = nullptr;
  std::string how;
  const std::string path = rc::resolve_config_argument(ca.config, &how);
  rc::Config cfg = rc::load_and_check(path, ca.edits, &recipe);
  // Under `ingot launch` every rank runs this; rank 0 speaks for the run and writes its summary (the others
  // hold the same global figures), and one writer keeps the file from being replaced N times.
  rc::RunSettings placement;
  rc::resolve_placement(placement);  // this process's rank, as the run itself read it (env:// or MPI)
  if (placement.rank == 0) {
    // A name may stand for a built-in config the user never opened: say which file runs and where it writes.
    std::cerr << "config | " << path << (how.empty() ? "" : " (" + how + ")");
    if (cfg.has("output_dir")) std::cerr << " | output_dir " << fs::absolute(cfg.get_string("output_dir")).string();
    std::cerr << "\n";
  }
  std::string summary = recipe->run(cfg, std::cerr);
  if (!summary_path.empty() && placement.rank == 0) {
    fs::path parent = fs::path(summary_path).parent_path();
    if (!parent.empty()) fs::create_directories(parent);
    ingot::write_file_atomic(summary_path, [&](std::FILE* f) { ingot::write_bytes(f, summary.data(), summary.size()); });
  }
  return 0;
}

int ls_command(const Args& args) {
  for (std::string_view a : args) {
    if (is_help(a)) {
      std::cout << kLsHelp;
      return 0;
    }
    throw UsageError("unexpected argument '" + std::string(a) + "'", "ls");
  }
  std::vector<rc::BuiltinConfig> configs = rc::list_builtin_configs();
  for (const rc::Recipe& r : rc::all_recipes()) {
    std::cout << r.name << "  " << r.description << "\n";
    size_t width = 0;
    for (const rc::BuiltinConfig& c : configs) width = c.recipe == r.name ? std::max(width, c.name.size()) : width;
    for (const rc::BuiltinConfig& c : configs)
      if (c.recipe == r.name)
        std::cout << "    " << c.name << std::string(width - c.name.size() + 2, ' ') << c.description << "\n";
  }
  for (const rc::BuiltinConfig& c : configs)
    if (!rc::find_recipe(c.recipe)) std::cout << "(unknown recipe '" << c.recipe << "')  " << c.name << "\n";
  std::vector<std::string> dirs = rc::builtin_config_dirs();
  std::cout << "\nbuilt-in configs from: ";
  if (dirs.empty()) std::cout << "(none found: set INGOT_CONFIG_PATH)";
  for (size_t i = 0; i < dirs.size(); ++i) std::cout << (i ? ", " : "") << dirs[i];
  std::cout << "\n";
  return 0;
}

int cat_command(const Args& args) {
  ConfigArgs ca = parse_config_args(args, "cat");
  if (ca.help) {
    std::cout << kCatHelp;
    return 0;
  }
  if (ca.config.empty()) throw UsageError("missing CONFIG", "cat");
  if (!ca.edits.empty()) throw UsageError("cat takes one CONFIG", "cat");
  std::cout << ingot::read_file(rc::resolve_config_argument(ca.config));
  return 0;
}

int cp_command(const Args& args) {
  bool force = false;
  std::vector<std::string> pos;
  for (std::string_view a : args) {
    if (is_help(a)) {
      std::cout << kCpHelp;
      return 0;
    }
    if (a == "--force" || a == "-f")
      force = true;
    else if (a.size() > 1 && a[0] == '-')
      throw UsageError("unknown option '" + std::string(a) + "'", "cp");
    else
      pos.emplace_back(a);
  }
  if (pos.size() != 2) throw UsageError("expected CONFIG and PATH", "cp");
  std::string src = rc::resolve_config_argument(pos[0]);
  fs::path dst = pos[1];
  if (fs::is_directory(dst)) dst /= fs::path(src).filename();
  if (fs::exists(dst) && !force)
    throw UsageError("'" + dst.string() + "' exists; pass --force to overwrite it", "cp");
  std::string text = ingot::read_file(src);
  ingot::write_file_atomic(dst.string(), [&](std::FILE* f) { ingot::write_bytes(f, text.data(), text.size()); });
  std::cout << "copied " << src << " -> " << dst.string() << "\n";
  return 0;
}

int validate_command(const Args& args) {
  std::string summary_path, summary_problem;  // checked as `run --summary` would check it
  ConfigArgs ca = parse_config_args(args, "validate", summary_option(summary_path, summary_problem, "validate"));
  if (ca.help) {
    std::cout << kValidateHelp;
    return 0;
  }
  if (ca.config.empty()) throw UsageError("missing CONFIG", "validate");
  std::string path = rc::resolve_config_argument(ca.config);
  const rc::Recipe* recipe = nullptr;
  try {
    rc::load_and_check(path, ca.edits, &recipe);
  } catch (const ConfigError& e) {
    if (summary_problem.empty()) throw;
    throw ConfigError(std::string(e.what()) + "\n" + summary_problem);
  }
  if (!summary_problem.empty()) throw ConfigError(summary_problem);
  std::cout << path << ": valid " << recipe->name << " config\n";
  return 0;
}

int explain_command(const Args& args) {
  int64_t steps = 2;
  ConfigArgs ca = parse_config_args(args, "explain", [&](const Args& a, size_t& i) {
    if (a[i] != "--steps") return false;
    if (i + 1 >= a.size()) throw UsageError("--steps needs a number", "explain");
    const std::string v(a[++i]);
    char* end = nullptr;
    steps = std::strtoll(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || steps < 1) throw UsageError("--steps: expected a positive integer, got '" + v + "'", "explain");
    return true;
  });
  if (ca.help) {
    std::cout << kExplainHelp;
    return 0;
  }
  if (ca.config.empty()) throw UsageError("missing CONFIG", "explain");
  const std::string path = rc::resolve_config_argument(ca.config);
  {
    const rc::Recipe* recipe = nullptr;
    rc::load_and_check(path, ca.edits, &recipe);  // the user's config, as given, must be valid first
    if (recipe->name != "pretrain" && recipe->name != "full_finetune" && recipe->name != "lora_finetune")
      throw UsageError("recipe '" + recipe->name + "' has no training step to compile (explain takes pretrain, "
                       "full_finetune or lora_finetune configs)", "explain");
  }
  ingot::TempDir scratch("ingot-explain-");
  std::vector<std::string> edits = ca.edits;
  for (std::string e : {std::string("compile.enabled=true"), "max_steps=" + std::to_string(steps),
                        "output_dir=" + scratch.file("run"), std::string("resume=false"), std::string("resume_from=''")})
    edits.push_back(e);
  const rc::Recipe* recipe = nullptr;
  rc::Config cfg = rc::load_and_check(path, edits, &recipe);
  const nlohmann::json summary = nlohmann::json::parse(recipe->run(cfg, std::cerr));
  if (!summary.contains("compile_report") || !summary["compile_report"].is_string())
    throw std::runtime_error("the " + recipe->name + " run produced no compile report");
  std::cout << summary["compile_report"].get<std::string>();
  return 0;
}

int plot_command(const Args& args) {
  std::string run_dir, out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (is_help(a)) {
      std::cout << kPlotHelp;
      return 0;
    }
    if (a == "--out") {
      if (i + 1 >= args.size()) throw UsageError("--out needs a PATH", "plot");
      out = args[++i];
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError("unknown option '" + std::string(a) + "'", "plot");
    } else if (run_dir.empty()) {
      run_dir = a;
    } else {
      throw UsageError("unexpected argument '" + std::string(a) + "'", "plot");
    }
  }
  if (run_dir.empty()) throw UsageError("missing RUN_DIR", "plot");
  fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  if (!fs::is_regular_file(metrics))
    throw UsageError("'" + metrics.string() + "' does not exist (is '" + run_dir + "' a run directory?)", "plot");
  if (out.empty()) out = (fs::path(run_dir) / "loss.png").string();
  rc::plot_metrics_file(metrics.string(), out, fs::path(run_dir).filename().string());
  std::cout << "wrote " << out << "\n";
  return 0;
}

int dispatch(int argc, char** argv) {
  Args args(argv + 1, argv + argc);
  if (args.empty()) throw UsageError("no command given");
  std::string_view cmd = args[0];
  if (is_help(cmd) || cmd == "help") {
    std::cout << kMainHelp;
    return 0;
  }
  if (cmd == "--version" || cmd == "-V" || cmd == "version") {
    print_version();
    return 0;
  }
  static const std::map<std::string_view, int (*)(const Args&)> commands = {
      {"run", run_command},           {"ls", ls_command},     {"cat", cat_command}, {"cp", cp_command},
      {"validate", validate_command}, {"plot", plot_command},         {"explain", explain_command},
  };
  if (cmd == "launch") return ingot::launch_main(std::vector<std::string>(args.begin() + 1, args.end()));
  auto it = commands.find(cmd);
  if (it == commands.end()) {
    std::vector<std::string> names = {"launch"};
    for (const auto& [name, fn] : commands) names.emplace_back(name);
    const std::string hint = rc::closest_name(cmd, names);
    throw UsageError("unknown command '" + std::string(cmd) + "'" + (hint.empty() ? "" : "; did you mean '" + hint + "'?"));
  }
  return it->second({args.begin() + 1, args.end()});
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return dispatch(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "ingot: " << e.what() << "\n"
              << "Try 'ingot " << (e.command.empty() ? "" : e.command + " ") << "--help'.\n";
    return kExitUsage;
  } catch (const ConfigError& e) {
    ingot::distributed::launch::record_error(std::string("config error: ") + e.what(), "config error");
    std::cerr << "ingot: config error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    ingot::distributed::launch::record_error(e.what(), "error");  // for `ingot launch`'s failure report
    std::cerr << "ingot: error: " << e.what() << "\n";
    return kExitError;
  }
}
