#include "distributed/launch/options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>

#include "runtime/error.h"

namespace ingot::distributed::launch {


int StreamSpec::for_rank(int local_rank) const {
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? all : it->second;
}

double LaunchOptions::join_timeout_s() const {
  auto it = rdzv_conf.find("join_timeout");
  return it == rdzv_conf.end() ? 600.0 : std::stod(it->second);
}

double LaunchOptions::last_call_timeout_s() const {
  auto it = rdzv_conf.find("last_call_timeout");
  return it == rdzv_conf.end() ? 30.0 : std::stod(it->second);
}

namespace {

[[noreturn]] void usage(const std::string& msg) { throw LaunchUsageError(msg); }

bool parse_int(const std::string& s, long long& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

int int_flag(const std::string& flag, const std::string& v, long long lo, long long hi, const char* what) {
  long long x = 0;
  if (!parse_int(v, x) || x < lo || x > hi)
    usage(flag + ": expected " + what + ", got '" + v + "'");
  return static_cast<int>(x);
}

double seconds_flag(const std::string& flag, const std::string& v, bool allow_zero) {
  double x = 0;
  size_t used = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || !std::isfinite(x) || x < 0 || (!allow_zero && x == 0))
    usage(flag + ": expected a number of seconds" + (allow_zero ? " >= 0" : " > 0") + ", got '" + v + "'");
  return x;
}

StreamSpec parse_streams(const std::string& flag, const std::string& v) {
  StreamSpec s;
  auto stream_value = [&](const std::string& x) {
    long long n = -1;
    if (!parse_int(x, n) || n < 0 || n > 3)
      usage(flag + ": expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or a per-rank map like 0:1,1:3; got '" +
            v + "'");
    return static_cast<int>(n);
  };
  if (v.find(':') == std::string::npos) {
    s.all = stream_value(v);
    return s;
  }
  size_t start = 0;
  while (start <= v.size()) {
    size_t comma = v.find(',', start);
    std::string item = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t colon = item.find(':');
    long long rank = -1;
    if (colon == std::string::npos || !parse_int(item.substr(0, colon), rank) || rank < 0)
      usage(flag + ": expected LOCAL_RANK:STREAMS items separated by commas (e.g. 0:1,1:3), got '" + v + "'");
    s.per_rank[static_cast<int>(rank)] = stream_value(item.substr(colon + 1));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

LocalWorld resolve_nproc(const std::string& spec, int num_gpus, int num_cpus) {
  if (spec == "gpu") {
    if (num_gpus <= 0)
      usage("--nproc-per-node gpu: no CUDA device is visible (built without CUDA, or no GPU); use a number or cpu");
    return {num_gpus, true};
  }
  if (spec == "cpu") return {std::max(num_cpus, 1), false};
  if (spec == "auto") return num_gpus > 0 ? LocalWorld{num_gpus, true} : LocalWorld{std::max(num_cpus, 1), false};
  return {int_flag("--nproc-per-node", spec, 1, 4096, "a positive number, gpu, cpu or auto"), false};
}

std::vector<std::string> gpu_assignment(int nproc, const std::string& launcher_visible_devices) {
  std::vector<std::string> ids;
  size_t start = 0;
  while (!launcher_visible_devices.empty() && start <= launcher_visible_devices.size()) {
    size_t comma = launcher_visible_devices.find(',', start);
    ids.push_back(launcher_visible_devices.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (ids.empty())
    for (int i = 0; i < nproc; ++i) ids.push_back(std::to_string(i));
  INGOT_CHECK(static_cast<int>(ids.size()) >= nproc, nproc,
              " GPU workers but CUDA_VISIBLE_DEVICES='", launcher_visible_devices, "' lists only ", ids.size());
  ids.resize(static_cast<size_t>(nproc));
  return ids;
}

namespace {

// `ingot launch --help` around CLI11's list of flags: what the launcher does, then the workers' environment, the
// failure handling and the exit status.
constexpr const char* kHelpIntro = R"(Usage: ingot launch [options] [--] COMMAND [ARGS ...]

Starts COMMAND (e.g. `ingot run CONFIG ...`, or any program) as a group of worker processes, torchrun style:
  ingot launch --nproc-per-node 4 -- ingot run configs/gpt2.yaml
  ingot launch --nnodes 2 --rdzv-endpoint host0:29400 --rdzv-id job7 --nproc-per-node 8 -- ingot run CFG

Everything from COMMAND on (or after `--`) goes to the workers untouched. Flags take their value as
`--flag VALUE` or `--flag=VALUE`, and torchrun's underscore spellings too (--nproc_per_node, --max_restarts).
)";

constexpr const char* kHelpAfter = R"(
Each worker's environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (node rank),
GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (the launcher's store; workers
connect to it, INGOT_USE_AGENT_STORE=1, one key prefix per attempt), INGOT_RESTART_COUNT (0 on the first
attempt), INGOT_MAX_RESTARTS, INGOT_RUN_ID, INGOT_ERROR_FILE (where `ingot run` writes a JSON description of
an uncaught error), and with the flags above INGOT_COLLECTIVE_TIMEOUT_S and INGOT_INIT_TIMEOUT_S.

When a worker exits non-zero or is killed, every worker is stopped (SIGTERM, SIGKILL after --stop-timeout),
the first failure is reported as the root cause (rank, exit code or signal, host, its last output lines and
its error file) and the group restarts while restarts remain; a recipe resumes from its last checkpoint by
reading INGOT_RESTART_COUNT. A root cause that exited with code 2 (`ingot run`'s usage or config error)
is not restarted: it would fail the same way. Without --log-dir the logs and error files go to a directory
in $TMPDIR (default /tmp), which a failed job keeps (the report points into it) and a successful one removes.
Ctrl-C or SIGTERM to the launcher stops the workers the same way.
Exit status: 0 all workers succeeded, 1 a worker failed and no restarts remain (or rendezvous failed),
2 bad command line, 130 interrupted (SIGINT), 143 terminated (SIGTERM).
)";

// One launcher flag: its torchrun name (dashes), the value it takes (empty: a switch), its help group and text,
// and what it does with a value. This table is the whole command line: the parser and --help are built from it.
struct Flag {
  std::string name, value, group, help;
  std::function<void(const std::string& flag, const std::string& value)> set;
};

// What parsing collects besides LaunchOptions: the checks across flags need to know what was given.
struct ParseState {
  LaunchOptions o;
  std::string nnodes;
  bool node_rank_given = false, master_given = false;
};

// -h/--help stops parsing where it stands (flags before it are checked, nothing after it is).
struct HelpRequested {};

std::vector<Flag> launch_flags(ParseState& st) {
  LaunchOptions& o = st.o;
  const std::string workers = "Workers (per node)", nodes = "Nodes and rendezvous", failures = "Failures",
                    logs = "Logs";
  return {
      {"--nproc-per-node", "N|gpu|cpu|auto", workers,
       "workers on this node: N; one per GPU (gpu: error without one); one per CPU core (cpu); GPUs if any, else "
       "CPU cores (auto). Default 1. With gpu/auto and GPUs, worker i sees only its GPU (CUDA_VISIBLE_DEVICES).",
       [&](const std::string& f, const std::string& v) {
         if (v != "gpu" && v != "cpu" && v != "auto") int_flag(f, v, 1, 4096, "a positive number, gpu, cpu or auto");
         o.nproc_per_node = v;
       }},
      {"--nnodes", "N|MIN:MAX", nodes, "number of nodes (default 1); MIN:MAX needs --rdzv-endpoint",
       [&](const std::string&, const std::string& v) { st.nnodes = v; }},
      {"--node-rank", "R", nodes, "this node's rank, 0..N-1, without --rdzv-endpoint (default 0)",
       [&](const std::string& f, const std::string& v) {
         o.node_rank = int_flag(f, v, 0, 1 << 20, "a node rank >= 0");
         st.node_rank_given = true;
       }},
      {"--master-addr", "ADDR", nodes, "address of node 0, without --rdzv-endpoint (default 127.0.0.1)",
       [&](const std::string& f, const std::string& v) {
         if (v.empty()) usage(f + ": expected a host name or address, got ''");
         o.master_addr = v;
         st.master_given = true;
       }},
      {"--master-port", "PORT", nodes, "port of node 0's store (default 0 = a free port; required with --nnodes > 1)",
       [&](const std::string& f, const std::string& v) {
         o.master_port = int_flag(f, v, 0, 65535, "a port 0..65535 (0 = pick a free one)");
         st.master_given = true;
       }},
      {"--rdzv-endpoint", "HOST[:PORT]", nodes,
       "store for multi-node rendezvous (port default 29400); the node on HOST hosts it, others connect; ranks "
       "follow the order nodes join",
       [&](const std::string&, const std::string& v) { o.rdzv_endpoint = v; }},
      {"--rdzv-id", "ID", nodes, "job id shared by all nodes (default \"none\"); workers see it as INGOT_RUN_ID",
       [&](const std::string& f, const std::string& v) {
         if (v.empty() || v.find_first_of("/ \t\n") != std::string::npos)
           usage(f + ": expected a non-empty id without '/' or spaces, got '" + v + "'");
         o.rdzv_id = v;
       }},
      {"--rdzv-conf", "K=V[,K=V]", nodes, "join_timeout (s, default 600), last_call_timeout (s, default 30)",
       [&](const std::string& f, const std::string& v) {
         size_t start = 0;
         while (start < v.size()) {
           size_t comma = v.find(',', start);
           std::string item = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
           size_t eq = item.find('=');
           std::string key = item.substr(0, eq);
           if (eq == std::string::npos || (key != "join_timeout" && key != "last_call_timeout"))
             usage(f + ": expected join_timeout=SECONDS and/or last_call_timeout=SECONDS, got '" + item + "'");
           seconds_flag(f + " " + key, item.substr(eq + 1), true);
           o.rdzv_conf[key] = item.substr(eq + 1);
           if (comma == std::string::npos) break;
           start = comma + 1;
         }
       }},
      {"--rdzv-backend", "c10d|static", nodes,
       "accepted for torchrun command lines; ingot's rendezvous always goes through its own TCP store",
       [&](const std::string& f, const std::string& v) {
         if (v != "c10d" && v != "static")
           usage(f + ": expected c10d or static (ingot rendezvous through its TCP store), got '" + v + "'");
       }},
      {"--standalone", "", nodes, "single node, store on a free local port (ignores master address/port)",
       [&](const std::string&, const std::string&) { o.standalone = true; }},
      {"--local-addr", "ADDR", nodes,
       "address other nodes use to reach this node's workers (exported as INGOT_GLOO_HOSTNAME; default: the "
       "host name, loopback on a single node)",
       [&](const std::string& f, const std::string& v) {
         if (v.empty()) usage(f + ": expected a host name or address, got ''");
         o.local_addr = v;
       }},
      {"--max-restarts", "N", failures, "restart the whole group up to N times after a worker fails (default 0)",
       [&](const std::string& f, const std::string& v) {
         o.max_restarts = int_flag(f, v, 0, 1000000, "a count >= 0");
       }},
      {"--monitor-interval", "SECONDS", failures, "how often workers are checked (default 0.1)",
       [&](const std::string& f, const std::string& v) { o.monitor_interval_s = seconds_flag(f, v, false); }},
      {"--stop-timeout", "SECONDS", failures, "grace between SIGTERM and SIGKILL when stopping workers (default 30)",
       [&](const std::string& f, const std::string& v) { o.stop_timeout_s = seconds_flag(f, v, true); }},
      {"--collective-timeout", "SECONDS", failures,
       "a collective of `ingot run` workers that takes longer fails, naming the ranks that never joined (default "
       "600; config distributed.timeout_s wins)",
       [&](const std::string& f, const std::string& v) { o.collective_timeout_s = seconds_flag(f, v, false); }},
      {"--init-timeout", "SECONDS", failures,
       "how long workers wait for each other to check in at start and at barriers (default 300; config "
       "distributed.init_timeout_s wins)",
       [&](const std::string& f, const std::string& v) { o.init_timeout_s = seconds_flag(f, v, false); }},
      {"--log-dir", "DIR", logs, "per attempt and rank: DIR/attempt_N/rank_R/{stdout,stderr}.log, error.json",
       [&](const std::string& f, const std::string& v) {
         if (v.empty()) usage(f + ": expected a directory, got ''");
         if (std::filesystem::exists(v) && !std::filesystem::is_directory(v))
           usage(f + ": '" + v + "' exists and is not a directory");
         o.log_dir = v;
       }},
      {"--redirects", "0|1|2|3|R:S,...", logs,
       "send worker stdout (1), stderr (2) or both (3) to the log files only; a map like 0:3,1:2 sets it per "
       "local rank",
       [&](const std::string& f, const std::string& v) { o.redirects = parse_streams(f, v); }},
      {"--tee", "0|1|2|3|R:S,...", logs,
       "send the streams to the log files and to the console, lines prefixed with \"[RANK]:\"",
       [&](const std::string& f, const std::string& v) { o.tee = parse_streams(f, v); }},
  };
}

// "--nproc-per-node" -> CLI11's name list holding every spelling with '_' in place of any '-' inside the name
// (--nproc-per-node, --nproc_per_node, --nproc-per_node, ...): torchrun takes the underscore ones.
std::string cli_names(const std::string& flag) {
  std::vector<size_t> dashes;
  for (size_t i = 2; i < flag.size(); ++i)
    if (flag[i] == '-') dashes.push_back(i);
  std::string names;
  for (size_t mask = 0; mask < (size_t{1} << dashes.size()); ++mask) {
    std::string spelling = flag;
    for (size_t k = 0; k < dashes.size(); ++k)
      if (mask & (size_t{1} << k)) spelling[dashes[k]] = '_';
    names += (names.empty() ? "" : ",") + spelling;
  }
  return names;
}

// The help lists each flag once, in its torchrun dash spelling, with its value, in the table's groups.
class LaunchHelpFormatter : public CLI::Formatter {
 public:
  LaunchHelpFormatter() { column_width(35); }
  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode) const override {
    std::ostringstream out;
    out << kHelpIntro;
    for (const std::string& group : app->get_groups()) {
      out << "\n" << group << ":\n";
      for (const CLI::Option* opt : app->get_options([&](const CLI::Option* o) { return o->get_group() == group; }))
        out << make_option(opt, false);
    }
    out << kHelpAfter;
    return out.str();
  }
  std::string make_option_name(const CLI::Option* opt, bool) const override {
    std::string name = "--" + opt->get_lnames().front();
    return opt->get_snames().empty() ? name : "-" + opt->get_snames().front() + ", " + name;
  }
  // Descriptions wrap at 115 columns (CLI11 indents each line after a newline to the description column).
  std::string make_option_desc(const CLI::Option* opt) const override {
    const size_t room = 115 - get_column_width();
    std::string out, line;
    std::istringstream words(opt->get_description());
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

// The CLI11 app for `ingot launch`: every flag of `flags` (each applied as soon as it is read, so flags are
// checked in command-line order and a repeated flag's last value wins), -h/--help, and the command: parsing
// stops at the first argument that is not a flag or flag value (prefix_command), or after `--`.
std::unique_ptr<CLI::App> make_launch_cli(const std::vector<Flag>& flags) {
  auto app = std::make_unique<CLI::App>("", "ingot launch");
  app->formatter(std::make_shared<LaunchHelpFormatter>());
  app->set_help_flag();
  app->prefix_command();
  for (const Flag& flag : flags) {
    const Flag* f = &flag;
    CLI::Option* opt = app->add_option(
        cli_names(flag.name),
        [f](const CLI::results_t& r) {
          // A switch given as --standalone=VALUE arrives as VALUE ("true" without one).
          if (f->value.empty() && !r.empty() && r.front() != "true") usage(f->name + " takes no value");
          f->set(f->name, r.empty() ? std::string() : r.front());
          return true;
        },
        flag.help);
    opt->group(flag.group)->trigger_on_parse();
    if (flag.value.empty())
      opt->expected(0);
    else
      opt->expected(1)->option_text(flag.value);
  }
  app->add_option(
         "-h,--help", [](const CLI::results_t&) -> bool { throw HelpRequested{}; }, "this help")
      ->group("Help")
      ->expected(0)
      ->trigger_on_parse();
  return app;
}

// An argument that looks like a flag but is none of the launcher's: name it, with the closest flag.
[[noreturn]] void unknown_flag(const std::string& arg, const std::vector<Flag>& flags) {
  std::string flag = arg.substr(0, arg.find('='));
  if (flag.size() > 2) std::replace(flag.begin() + 2, flag.end(), '_', '-');
  // Flags that take a value in name order, then the switches: on a tie the first one wins.
  std::vector<std::string> names, switches;
  for (const Flag& f : flags) (f.value.empty() ? switches : names).push_back(f.name);
  std::sort(names.begin(), names.end());
  names.insert(names.end(), switches.begin(), switches.end());
  std::string best;
  size_t best_d = 4;
  for (const std::string& name : names)
    if (size_t d = edit_distance(flag, name); d < best_d) best_d = d, best = name;
  usage("unknown option '" + arg + "'" + (best.empty() ? "" : " (did you mean " + best + "?)"));
}

}  // namespace

std::string launch_help() {
  ParseState st;
  std::vector<Flag> flags = launch_flags(st);
  return make_launch_cli(flags)->help();
}

const char* const kLaunchHelp = [] {
  static const std::string text = launch_help();
  return text.c_str();
}();

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  ParseState st;
  LaunchOptions& o = st.o;
  std::vector<Flag> flags = launch_flags(st);
  std::unique_ptr<CLI::App> app = make_launch_cli(flags);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes the next argument from the back
  try {
    app->parse(reversed);
  } catch (const HelpRequested&) {
    o.help = true;
    return o;
  } catch (const CLI::ArgumentMismatch&) {
    // A flag that takes a value came last, without one.
    std::string flag = args.empty() ? std::string() : args.back().substr(0, args.back().find('='));
    if (flag.size() > 2) std::replace(flag.begin() + 2, flag.end(), '_', '-');
    usage(flag + " needs a value");
  } catch (const CLI::ParseError& e) {
    usage(e.what());
  }
  // What CLI11 did not take: the command, after a `--` when one ended the flags, or an unknown flag first.
  std::vector<std::string> rest = app->remaining();
  if (!rest.empty() && rest.front() == "--")
    rest.erase(rest.begin());
  else if (!rest.empty() && rest.front().size() >= 2 && rest.front()[0] == '-')
    unknown_flag(rest.front(), flags);
  o.command = std::move(rest);
  if (o.command.empty()) usage("missing the worker command (e.g. ingot launch --nproc-per-node 2 -- ingot run CONFIG)");

  const std::string& nnodes = st.nnodes;
  if (!nnodes.empty()) {
    size_t colon = nnodes.find(':');
    std::string lo = nnodes.substr(0, colon), hi = colon == std::string::npos ? lo : nnodes.substr(colon + 1);
    long long a = 0, b = 0;
    if (!parse_int(lo, a) || !parse_int(hi, b) || a < 1 || b < a || b > (1 << 20))
      usage("--nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX, got '" + nnodes + "'");
    o.min_nodes = static_cast<int>(a);
    o.max_nodes = static_cast<int>(b);
  }
  if (!o.rdzv_endpoint.empty()) {
    std::string host = o.rdzv_endpoint, port = "29400";
    if (size_t colon = host.rfind(':'); colon != std::string::npos) {
      port = host.substr(colon + 1);
      host = host.substr(0, colon);
    }
    if (host.empty()) usage("--rdzv-endpoint: expected HOST[:PORT], got '" + o.rdzv_endpoint + "'");
    int p = int_flag("--rdzv-endpoint port", port, 1, 65535, "a port 1..65535");
    o.rdzv_endpoint = host + ":" + std::to_string(p);
  }
  if (o.standalone) {
    if (!o.rdzv_endpoint.empty()) usage("--standalone starts its own store: drop --rdzv-endpoint");
    if (o.max_nodes > 1) usage("--standalone is a single-node run: --nnodes must be 1, got " + nnodes);
    if (st.node_rank_given && o.node_rank != 0) usage("--standalone is a single-node run: --node-rank must be 0");
  }
  if (o.rdzv_endpoint.empty()) {
    if (o.min_nodes != o.max_nodes)
      usage("--nnodes " + nnodes + ": a node range needs --rdzv-endpoint (nodes join a store there)");
    if (o.node_rank >= o.max_nodes)
      usage("--node-rank " + std::to_string(o.node_rank) + " is out of range for --nnodes " +
            std::to_string(o.max_nodes) + " (expected 0.." + std::to_string(o.max_nodes - 1) + ")");
    if (o.max_nodes > 1 && o.master_port == 0)
      usage("--nnodes " + std::to_string(o.max_nodes) +
            " needs --master-port (or --rdzv-endpoint): every node must know where node 0's store listens");
  } else if (st.master_given) {
    usage("--master-addr/--master-port and --rdzv-endpoint both say where the store is: give only one");
  }
  if (o.rdzv_id.empty() && !o.rdzv_endpoint.empty()) o.rdzv_id = "none";
  return o;
}
}  // namespace ingot::distributed::launch
