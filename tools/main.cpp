// The `ingot` program. Commands: run, ls, cat, cp, validate, explain, plot, launch. The command line is parsed
// with CLI11 (one CLI::App per command, built in make_cli()); each command's help is its usage line, its prose
// and the option list CLI11 generates from the same definitions, so --help names every option there is.
// Exit status: 0 done, 1 runtime error, 2 usage or config error (nothing written).
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
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

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// Thrown for bad command lines; exit code 2 and a pointer to --help.
struct UsageError : std::exception {
  explicit UsageError(std::string m, std::string cmd = "") : msg(std::move(m)), command(std::move(cmd)) {}
  const char* what() const noexcept override { return msg.c_str(); }
  std::string msg, command;
};

// What `ingot --help` and `ingot NAME --help` say about a command besides the generated option list.
struct CommandText {
  std::string name, usage, summary;  // usage: the arguments after `ingot NAME`
  std::string about;                 // prose before the options
  std::string after;                 // prose after the options
};

const std::vector<CommandText>& command_texts() {
  static const std::vector<CommandText> texts = {
      {"run", "CONFIG [key=value ...] [~key ...] [--summary PATH]", "run the recipe a config describes",
       R"(Runs the recipe named by the config's `recipe:` key (default pretrain). Everything the config says is
checked first, and every problem is reported at once; nothing is written unless the config is valid.)",
       R"(The first line names the config file (and the built-in config a name resolved to) and the output_dir.
Progress goes to stderr, one line every train.log_every steps (loss averaged and memory peaked since the
previous line; gnorm: the gradient norm before clipping; ETA - until a compiled run's first step is done):
  step 20/300 | loss 2.345 | lr 3.0e-04 | gnorm 0.84 | 12.3k tok/s | MFU 31.2% | mem peak 1.25 GiB | ETA 0:41
output_dir receives model.safetensors, config.yaml (the resolved config), summary.json, metrics.jsonl (one
record per step; a failed run's records after its last checkpoint go to metrics.failed.jsonl), loss.png
(loss and learning rate), checkpoints/step_N/ (checkpoint.save_every), tensorboard/ (logging.tensorboard) and
profile/ (profile.enabled).
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
)"},
      {"ls", "", "recipes and their built-in configs",
       R"(Lists the recipes and, under each, the built-in configs that run it (name and first comment line), then
the directories searched for built-in configs.)",
       ""},
      {"cat", "CONFIG", "print a config",
       "Prints a config file (a path, or a built-in config name such as quickstart) to stdout.", ""},
      {"cp", "CONFIG PATH [--force]", "copy a built-in config to edit it",
       R"(Copies a config (usually a built-in one) to PATH so you can edit it. PATH may be a directory (the file
keeps its name). An existing file is not overwritten unless --force is given.)",
       ""},
      {"validate", "CONFIG [key=value ...] [~key ...] [--summary PATH]", "check a config fully, without running",
       R"(Checks a config as `ingot run` would before its first step (YAML syntax, unknown keys with a suggestion, types,
ranges and choices, required keys, the recipe's own rules; data files present, non-empty and UTF-8, and a
validation split long enough for one block; the tokenizer and the chat template; a checkpoint to resume from
and an earlier run's checkpoints in output_dir; that output_dir, its checkpoints/ and --summary PATH can be
written) without running anything, and prints ALL problems at once, each with file:line:column and the key
path.)",
       "Exit status: 0 valid, 2 invalid.\n"},
      {"explain", "CONFIG [key=value ...] [~key ...] [--steps N]", "what the compiler does with the training step",
       R"(Compiles the training step of a pretrain / full_finetune / lora_finetune config and reports what the compiler
did: graphs and graph breaks (reason and source line), ops before and after the passes, fusion groups,
kernels generated and reused, launches per step against eager's op count, recompiles with their reasons,
planned peak memory and compile time by phase. It runs N real training steps (default 2: the first traces
and compiles, the second runs the compiled graph) with compile.enabled=true, into a temporary output_dir
that is removed afterwards: nothing in the config's output_dir is touched. The training log goes to stderr,
the report to stdout. The config's compile.* keys (mode, dynamic, memory_budget, cache_dir...) apply.)",
       "Exit status: 0 done, 1 runtime error, 2 usage or config error.\n"},
      {"plot", "RUN_DIR [RUN_DIR ...] [--out PATH]", "draw runs' metrics.jsonl as a PNG",
       R"(Draws the training loss (raw and smoothed, and the validation loss when evaluated) and, below it, the
learning rate against the step from RUN_DIR/metrics.jsonl into a PNG: RUN_DIR/loss.png unless --out is
given. Several RUN_DIRs overlay their runs in one figure, one colour per run (--out is then required).
Runs draw their own loss.png at the end (logging.plot).)",
       ""},
  };
  return texts;
}

const CommandText& text_of(const std::string& name) {
  for (const CommandText& t : command_texts())
    if (t.name == name) return t;
  throw std::logic_error("no help text for command '" + name + "'");
}

constexpr const char* kLaunchUsage = "[options] -- COMMAND [ARGS ...]";
constexpr const char* kLaunchSummary = "run COMMAND as N workers, torchrun style";

constexpr const char* kMainAbout =
    "ingot: a C++20 training framework (autograd, whole-step compiler, data parallel; CPU and CUDA)\n";

constexpr const char* kMainAfter = R"(
CONFIG is a YAML file, a built-in config name (quickstart) or a recipe name (pretrain). Built-in configs
come from $INGOT_CONFIG_PATH, <prefix>/share/ingot/configs beside an installed bin/ingot, or the source
tree's configs/ when ingot runs from a build directory inside it.

Recipes: pretrain, full_finetune, lora_finetune (Hugging Face checkpoints), eval (perplexity), generate.

Examples:
  ingot run configs/quickstart.yaml
  ingot run quickstart max_steps=50 device=cpu --summary runs/summary.json
  ingot cp quickstart my.yaml && ingot validate my.yaml
  ingot run llama_lora_finetune && ingot run generate_text model.path=runs/llama_lora_finetune/hf
  ingot plot runs/a runs/b --out compare.png

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
  INGOT_CUDA_MEMORY_LIMIT_GIB=X  reserve at most X GiB per GPU (fail where a smaller card would, e.g. 23 for 24 GB)
  INGOT_OFFLOAD_AHEAD=BYTES      train.optimizer_offload's window of state copied in ahead (default min(1 GiB,
                                 state/8); 0: the next parameter's only)
)";

// `ingot --help`: one usage line per command (from command_texts(), launch's from its own help), then prose.
std::string main_help() {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const CommandText& t : command_texts())
    rows.emplace_back("ingot " + t.name + (t.usage.empty() ? "" : " " + t.usage), t.summary);
  rows.emplace_back(std::string("ingot launch ") + kLaunchUsage, kLaunchSummary);
  rows.emplace_back("ingot --help | --version", "");
  size_t width = 0;
  for (const auto& r : rows) width = std::max(width, r.first.size());
  std::ostringstream out;
  out << kMainAbout << "\nUsage:\n";
  for (const auto& [usage, summary] : rows)
    out << "  " << usage << (summary.empty() ? "" : std::string(width - usage.size() + 3, ' ') + summary) << "\n";
  out << kMainAfter;
  return out.str();
}

// A command's help: "Usage: ingot NAME ARGS", its prose, CLI11's list of its arguments and options, then the
// prose after them.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() {
    column_width(22);
    label("TEXT", "VALUE");
  }
  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode mode) const override {
    const CommandText& t = text_of(app->get_name());
    std::ostringstream out;
    out << "Usage: ingot " << t.name << (t.usage.empty() ? "" : " " + t.usage) << "\n\n" << t.about << "\n";
    out << make_positionals(app) << make_groups(app, mode);
    if (!t.after.empty()) out << "\n" << t.after;
    return out.str();
  }
  // Descriptions wrap at 110 columns (CLI11 indents each line after a newline to the description column).
  std::string make_option_desc(const CLI::Option* opt) const override {
    const size_t room = 110 - get_column_width();
    std::string out, line;
    std::istringstream words(CLI::Formatter::make_option_desc(opt));
    for (std::string w; words >> w;) {
      if (!line.empty() && line.size() + 1 + w.size() > room) {
        out += line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + w;
    }
    return out + line;
  }
};

void print_version() {
#ifdef INGOT_WITH_CUDA
  const char* cuda = "yes";
#else
  const char* cuda = "no";
#endif
  std::cout << "ingot " << INGOT_VERSION << " (CUDA: " << cuda
            << ", CUDA devices visible: " << ingot::cuda_device_count() << ")\n";
}

// Everything the command line can say, filled in by CLI11.
struct Args {
  bool help = false;
  std::string config;
  std::vector<std::string> edits;  // key=value and ~key, in order
  std::string summary;             // run, validate: --summary PATH
  std::string steps = "2";         // explain: --steps N (checked by explain_command, which names the value)
  std::vector<std::string> paths;  // cp: CONFIG PATH; plot: RUN_DIR...
  std::string out;                 // plot: --out PATH
  bool force = false;              // cp: --force
};

// One CLI::App per command; they all write into `a`.
std::unique_ptr<CLI::App> make_cli(Args& a) {
  auto app = std::make_unique<CLI::App>("ingot", "ingot");
  app->formatter(std::make_shared<HelpFormatter>());
  app->set_help_flag();
  app->require_subcommand(1);
  auto command = [&](const std::string& name) {
    CLI::App* sub = app->add_subcommand(name, text_of(name).summary);
    sub->set_help_flag();
    sub->add_flag("-h,--help", a.help, "this help");
    return sub;
  };
  auto config_args = [&](CLI::App* sub) {
    sub->add_option("CONFIG", a.config, "a YAML file, a built-in config name, or a recipe name (see `ingot ls`)")
        ->option_text(" ");
    sub->add_option("key=value|~key", a.edits,
                    "key=value sets one key, e.g. max_steps=50 train.lr=3e-4 device=cpu (the value is YAML, typed "
                    "by the schema like the file's values); ~key removes a key (or a whole section) so its default "
                    "applies, e.g. ~train.min_lr")
        ->option_text(" ");
  };
  CLI::App* run = command("run");
  config_args(run);
  run->add_option("--summary", a.summary, "also write the run's summary JSON to PATH (atomically, when the run ends)")
      ->type_name("PATH")
      ->option_text("PATH");
  command("ls");
  CLI::App* cat = command("cat");
  cat->add_option("CONFIG", a.config, "a config file or a built-in config name")->option_text(" ");
  CLI::App* cp = command("cp");
  cp->add_option("CONFIG PATH", a.paths, "the config to copy, and the file or directory to copy it to")
      ->option_text(" ");
  cp->add_flag("-f,--force", a.force, "overwrite PATH when it exists");
  CLI::App* validate = command("validate");
  config_args(validate);
  validate->add_option("--summary", a.summary, "check that the summary PATH `ingot run` would write can be written")
      ->type_name("PATH")
      ->option_text("PATH");
  CLI::App* explain = command("explain");
  config_args(explain);
  explain->add_option("--steps", a.steps, "training steps to run (default 2: one traces and compiles, one runs)")
      ->type_name("N")
      ->option_text("N");
  CLI::App* plot = command("plot");
  plot->add_option("RUN_DIR", a.paths, "a run's output_dir (holding metrics.jsonl); several overlay")->option_text(" ");
  plot->add_option("--out", a.out, "the PNG to write (default RUN_DIR/loss.png; required with several RUN_DIRs)")
      ->type_name("PATH")
      ->option_text("PATH");
  return app;
}

// CONFIG must be given; overrides look like key=value, removals ~key.
void check_config_args(const Args& a, const std::string& cmd, const std::string& missing = "missing CONFIG") {
  if (a.config.empty()) throw UsageError(missing, cmd);
  for (const std::string& e : a.edits)
    if (e.find('=') == std::string::npos && !(e.size() > 1 && e[0] == '~'))
      throw UsageError("unexpected argument '" + e + "' (overrides look like key=value, removals ~key)", cmd);
}

void print_recipe_keys(const std::string& config_arg) {
  const rc::Recipe* recipe = rc::find_recipe("pretrain");
  if (!config_arg.empty()) {
    rc::Config cfg = rc::Config::load(rc::resolve_config_argument(config_arg));
    recipe = &rc::recipe_of(cfg);
  }
  std::cout << "\nConfig keys of recipe '" << recipe->name << "' (type = default):\n" << recipe->schema().help();
}

// Why --summary PATH cannot be written ("" when it can, or when none was given): run refuses it before anything
// runs; validate reports it with the config's problems.
std::string summary_problem(const Args& a) {
  if (a.summary.empty()) return "";
  const std::string problem = rc::output_location_problem(a.summary, false);
  return problem.empty() ? "" : "--summary: " + problem;
}

int run_command(const Args& a) {
  check_config_args(a, "run", "missing CONFIG (a YAML file, e.g. configs/quickstart.yaml)");
  if (const std::string problem = summary_problem(a); !problem.empty()) throw UsageError(problem, "run");

  // Everything the config says is checked before any work starts or any file is written.
  const rc::Recipe* recipe = nullptr;
  std::string how;
  const std::string path = rc::resolve_config_argument(a.config, &how);
  rc::Config cfg = rc::load_and_check(path, a.edits, &recipe);
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
  if (!a.summary.empty() && placement.rank == 0) {
    fs::path parent = fs::path(a.summary).parent_path();
    if (!parent.empty()) fs::create_directories(parent);
    ingot::write_file_atomic(a.summary, [&](std::FILE* f) { ingot::write_bytes(f, summary.data(), summary.size()); });
  }
  return 0;
}

int ls_command(const Args&) {
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

int cat_command(const Args& a) {
  if (a.config.empty()) throw UsageError("missing CONFIG", "cat");
  std::cout << ingot::read_file(rc::resolve_config_argument(a.config));
  return 0;
}

int cp_command(const Args& a) {
  if (a.paths.size() != 2) throw UsageError("expected CONFIG and PATH", "cp");
  std::string src = rc::resolve_config_argument(a.paths[0]);
  fs::path dst = a.paths[1];
  if (fs::is_directory(dst)) dst /= fs::path(src).filename();
  if (fs::exists(dst) && !a.force)
    throw UsageError("'" + dst.string() + "' exists; pass --force to overwrite it", "cp");
  std::string text = ingot::read_file(src);
  ingot::write_file_atomic(dst.string(), [&](std::FILE* f) { ingot::write_bytes(f, text.data(), text.size()); });
  std::cout << "copied " << src << " -> " << dst.string() << "\n";
  return 0;
}

int validate_command(const Args& a) {
  check_config_args(a, "validate");
  const std::string problem = summary_problem(a);  // checked as `run --summary` would check it
  std::string path = rc::resolve_config_argument(a.config);
  const rc::Recipe* recipe = nullptr;
  try {
    rc::load_and_check(path, a.edits, &recipe);
  } catch (const ConfigError& e) {
    if (problem.empty()) throw;
    throw ConfigError(std::string(e.what()) + "\n" + problem);
  }
  if (!problem.empty()) throw ConfigError(problem);
  std::cout << path << ": valid " << recipe->name << " config\n";
  return 0;
}

int explain_command(const Args& a) {
  check_config_args(a, "explain");
  char* end = nullptr;
  const int64_t steps = std::strtoll(a.steps.c_str(), &end, 10);
  if (end == a.steps.c_str() || *end != '\0' || steps < 1)
    throw UsageError("--steps: expected a positive integer, got '" + a.steps + "'", "explain");
  const std::string path = rc::resolve_config_argument(a.config);
  {
    const rc::Recipe* recipe = nullptr;
    rc::load_and_check(path, a.edits, &recipe);  // the user's config, as given, must be valid first
    if (recipe->name != "pretrain" && recipe->name != "full_finetune" && recipe->name != "lora_finetune")
      throw UsageError("recipe '" + recipe->name +
                           "' has no training step to compile (explain takes pretrain, "
                           "full_finetune or lora_finetune configs)",
                       "explain");
  }
  ingot::TempDir scratch("ingot-explain-");
  std::vector<std::string> edits = a.edits;
  // No checkpoints: under `ingot launch` each rank has a scratch directory of its own, where a sharded (ZeRO-2/3)
  // checkpoint needs one directory for every rank's files; a dry run keeps none anyway.
  for (std::string e :
       {std::string("compile.enabled=true"), "max_steps=" + std::to_string(steps), "output_dir=" + scratch.file("run"),
        std::string("resume=false"), std::string("resume_from=''"), std::string("checkpoint.save_every=0")})
    edits.push_back(e);
  const rc::Recipe* recipe = nullptr;
  rc::Config cfg = rc::load_and_check(path, edits, &recipe);
  const nlohmann::json summary = nlohmann::json::parse(recipe->run(cfg, std::cerr));
  if (!summary.contains("compile_report") || !summary["compile_report"].is_string())
    throw std::runtime_error("the " + recipe->name + " run produced no compile report");
  std::cout << summary["compile_report"].get<std::string>();
  return 0;
}

int plot_command(const Args& a) {
  if (a.paths.empty()) throw UsageError("missing RUN_DIR", "plot");
  if (a.paths.size() > 1 && a.out.empty())
    throw UsageError("several RUN_DIRs are drawn into one figure: say where with --out PATH", "plot");
  std::vector<rc::PlotRun> runs;
  for (const std::string& dir : a.paths) {
    fs::path metrics = fs::path(dir) / "metrics.jsonl";
    if (!fs::is_regular_file(metrics))
      throw UsageError("'" + metrics.string() + "' does not exist (is '" + dir + "' a run directory?)", "plot");
    std::string name = fs::path(dir).lexically_normal().filename().string();
    if (name.empty() || name == ".") name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
    runs.push_back({name, metrics.string()});
  }
  const std::string out = a.out.empty() ? (fs::path(a.paths[0]) / "loss.png").string() : a.out;
  if (runs.size() == 1)
    rc::plot_metrics_file(runs[0].metrics_path, out, runs[0].name);
  else
    rc::plot_runs(runs, out);
  std::cout << "wrote " << out << "\n";
  return 0;
}

bool is_help(const std::string& a) { return a == "-h" || a == "--help" || a == "help"; }

int dispatch(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) throw UsageError("no command given");
  const std::string& cmd = args[0];
  if (is_help(cmd)) {
    std::cout << main_help();
    return 0;
  }
  if (cmd == "--version" || cmd == "-V" || cmd == "version") {
    print_version();
    return 0;
  }
  // The launcher keeps torchrun's spellings and parses its own flags (distributed/launch/options.h).
  if (cmd == "launch") return ingot::launch_main(std::vector<std::string>(args.begin() + 1, args.end()));

  Args a;
  std::unique_ptr<CLI::App> cli = make_cli(a);
  CLI::App* sub = nullptr;
  for (CLI::App* c : cli->get_subcommands([&](CLI::App* app) { return app->get_name() == cmd; })) sub = c;
  if (!sub) {
    if (!cmd.empty() && cmd[0] == '-') throw UsageError("unknown option '" + cmd + "'");
    std::vector<std::string> names = {"launch"};
    for (const CommandText& t : command_texts()) names.push_back(t.name);
    const std::string hint = rc::closest_name(cmd, names);
    throw UsageError("unknown command '" + cmd + "'" + (hint.empty() ? "" : "; did you mean '" + hint + "'?"));
  }
  try {
    cli->parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what(), cmd);
  }
  if (a.help) {
    std::cout << sub->help();
    if (cmd == "run") print_recipe_keys(a.config);
    return 0;
  }
  static const std::map<std::string, int (*)(const Args&)> commands = {
      {"run", run_command},           {"ls", ls_command},     {"cat", cat_command},         {"cp", cp_command},
      {"validate", validate_command}, {"plot", plot_command}, {"explain", explain_command},
  };
  return commands.at(cmd)(a);
}

}  // namespace

int main(int argc, char** argv) {
  // A write to a socket whose peer is gone (a rank that failed first) must be an error that names the collective,
  // not a silent death by SIGPIPE that the launcher would then report as the root cause (Python's default too).
  std::signal(SIGPIPE, SIG_IGN);
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
