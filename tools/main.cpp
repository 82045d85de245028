// The `ingot` program. Commands: run (train a recipe config). Exit status: 0 done, 1 runtime error,
// 2 usage or config error (nothing written).
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "distributed/launch/error_file.h"
#include "recipes/config.h"
#include "recipes/train.h"

#ifndef INGOT_VERSION
#define INGOT_VERSION "unknown"
#endif

namespace ingot {
int launch_main(const std::vector<std::string>& args);  // tools/launch.cpp
}  // namespace ingot

namespace {

using ingot::recipes::ConfigError;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// Thrown for bad command lines; exit code 2 and a pointer to --help.
struct UsageError : std::exception {
  explicit UsageError(std::string m, std::string cmd = "") : msg(std::move(m)), command(std::move(cmd)) {}
  const char* what() const noexcept override { return msg.c_str(); }
  std::string msg, command;
};

constexpr const char* kMainHelp = R"(ingot: a C++20 training framework (eager autograd on CPU and CUDA)

Usage:
  ingot run CONFIG [key=value ...] [--summary PATH]   train the recipe described by a YAML config
  ingot launch [options] -- COMMAND [ARGS ...]        run COMMAND as N workers, torchrun style
  ingot --help                                        this help
  ingot --version                                     version and build features

Examples:
  ingot run configs/quickstart.yaml
  ingot run configs/quickstart.yaml max_steps=50 device=cpu --summary runs/summary.json

`ingot run --help` lists every config key.
Exit status: 0 done, 1 runtime error, 2 usage or config error.
)";

constexpr const char* kRunHelp = R"(Usage: ingot run CONFIG [key=value ...] [--summary PATH]

Trains a GPT-2 from scratch on a UTF-8 text file (byte tokens, vocabulary 256), eager, then evaluates it on
the held-out tail of the text and saves it.

Arguments:
  CONFIG            a YAML file of the keys below (nested mappings or dotted keys)
  key=value         overrides one key, e.g. max_steps=50 train.lr=3e-4 device=cpu; the value is YAML
  --summary PATH    also writes the run's summary JSON to PATH (atomically, when the run ends)
  -h, --help        this help

Progress goes to stderr, one line every train.log_every steps (loss averaged since the previous line):
  step 20/300 | loss 2.345 | lr 3.0e-04 | 12.3k tok/s | ETA 0:41
then "eval | val_loss ..." and "done | ...". output_dir receives model.safetensors (f32 weights, Hugging
Face-style names), config.yaml (the resolved config) and summary.json.

Summary fields: steps, first_loss, final_loss, best_loss, val_loss, tokens_per_s, train_s, compile_s,
graphs, graph_breaks, recompiles (0 while training is eager), peak_memory_bytes, num_parameters, device,
dtype, output_dir, config, checkpoints.

Errors name the key and where it was set (file:line:column or the override); unknown keys get a
suggestion. Exit status: 0 done, 1 runtime error, 2 usage or config error (nothing is written).

Config keys (type = default):
)";

void print_version() {
#ifdef INGOT_WITH_CUDA
  const char* cuda = "yes";
#else
  const char* cuda = "no";
#endif
  std::cout << "ingot " << INGOT_VERSION << " (CUDA: " << cuda
            << ", CUDA devices visible: " << ingot::cuda_device_count() << ")\n";
}

int run_command(const std::vector<std::string_view>& args) {
  std::string config_path, summary_path;
  std::vector<std::string_view> overrides;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (a == "-h" || a == "--help") {
      std::cout << kRunHelp << ingot::recipes::pretrain_schema().help();
      return 0;
    }
    if (a == "--summary") {
      if (i + 1 >= args.size()) throw UsageError("--summary needs a PATH", "run");
      summary_path = args[++i];
    } else if (a.rfind("--summary=", 0) == 0) {
      summary_path = a.substr(std::strlen("--summary="));
      if (summary_path.empty()) throw UsageError("--summary needs a PATH", "run");
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError("unknown option '" + std::string(a) + "'", "run");
    } else if (config_path.empty()) {
      config_path = a;
    } else if (a.find('=') != std::string_view::npos) {
      overrides.push_back(a);
    } else {
      throw UsageError("unexpected argument '" + std::string(a) + "' (overrides look like key=value)", "run");
    }
  }
  if (config_path.empty()) throw UsageError("missing CONFIG (a YAML file, e.g. configs/quickstart.yaml)", "run");
  if (!summary_path.empty() && std::filesystem::is_directory(summary_path))
    throw UsageError("--summary '" + summary_path + "' is a directory; give a file path", "run");

  // Everything the config says is checked before any work starts or any file is written.
  ingot::recipes::Config cfg = ingot::recipes::Config::load(config_path);
  for (std::string_view o : overrides) cfg.apply_override(o);
  cfg.validate(ingot::recipes::pretrain_schema());
  ingot::recipes::PretrainSettings settings = ingot::recipes::resolve_pretrain(cfg);

  ingot::recipes::TrainSummary summary = ingot::recipes::run_pretrain(settings, std::cerr);
  if (!summary_path.empty()) ingot::recipes::write_summary(summary, summary_path);
  return 0;
}

int dispatch(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  if (args.empty()) throw UsageError("no command given");
  std::string_view cmd = args[0];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::cout << kMainHelp;
    return 0;
  }
  if (cmd == "--version" || cmd == "-V" || cmd == "version") {
    print_version();
    return 0;
  }
  if (cmd == "run") return run_command({args.begin() + 1, args.end()});
  if (cmd == "launch") return ingot::launch_main(std::vector<std::string>(args.begin() + 1, args.end()));
  throw UsageError("unknown command '" + std::string(cmd) + "'");
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
