#include "distributed/launch/agent.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "distributed/launch/error_file.h"
#include "distributed/launch/rendezvous.h"
#include "distributed/launch/workers.h"
#include "runtime/device.h"
#include "runtime/error.h"

extern char** environ;

namespace ingot::distributed::launch {

namespace {

namespace fs = std::filesystem;

constexpr size_t kReportLines = 15;  // output lines of the failed worker shown in its report
// `ingot run`'s exit status for a usage or config error: the same command fails the same way on a restart.
constexpr int kWorkerUsageExit = 2;

enum class Outcome { kSucceeded, kFailed, kInterrupted };

struct AttemptResult {
  Outcome outcome = Outcome::kSucceeded;
  std::string report;   // what to print about the failure
  std::string summary;  // one line: "rank 1 on host h exited with code 3"
  int signal = 0;       // kInterrupted: the signal the launcher received
  bool permanent = false;  // the root cause exited with kWorkerUsageExit: restarting cannot help
};

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string make_run_id() {
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << rd() << rd();
  return os.str().substr(0, 12);
}

std::string seconds_text(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) out.push_back(cur);
  return out;
}

// The launcher's environment with the worker's variables replaced.
std::vector<std::string> worker_env(const std::map<std::string, std::string>& vars) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string k = kv.substr(0, kv.find('='));
    if (!vars.count(k)) env.push_back(kv);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  return env;
}

// The root cause is the worker that failed first. A worker's failure time is the timestamp of its error file
// (written at the moment of the error) or else the moment it was reaped: when one rank dies (say, OOM-killed)
// and the others fail on the broken collective afterwards, the first failure is the one to fix. Ties go to
// the lower rank. A worker killed by SIGPIPE wrote to a socket or pipe whose other end had gone: the
// consequence of another failure, so it is the root cause only when no other worker failed (workers reaped in
// one poll are not ordered by when they died: a rank SIGKILLed and the peer its death broke came back together,
// and the peer, lower in rank, was named; Note [Ranks ignore SIGPIPE], bootstrap.cpp).
size_t choose_root_cause(const WorkerGroup& g) {
  size_t best = g.size();
  double best_t = 0;
  bool best_pipe = false;
  for (size_t i = 0; i < g.size(); ++i) {
    const WorkerStatus& s = g.status(i);
    if (!s.failed() || s.stopped_by_us) continue;
    auto rec = read_error_file(g.spec(i).error_file);
    double t = rec && rec->timestamp > 0 ? std::min(rec->timestamp, s.end_wall) : s.end_wall;
    const bool pipe = s.signal == SIGPIPE;
    if (best == g.size() || (best_pipe && !pipe) || (pipe == best_pipe && t < best_t)) {
      best = i;
      best_t = t;
      best_pipe = pipe;
    }
  }
  return best;
}

std::string indent(const std::string& text, const std::string& pad) {
  std::string out;
  for (const std::string& line : split(text, '\n')) out += pad + line + "\n";
  return out;
}

AttemptResult describe_failure(const WorkerGroup& g, size_t root, const NodeAssignment& a, const std::string& host) {
  const WorkerSpec& w = g.spec(root);
  const WorkerStatus& s = g.status(root);
  AttemptResult r;
  r.outcome = Outcome::kFailed;
  std::ostringstream sum;
  sum << "rank " << w.rank << " (local rank " << w.local_rank << " on node " << a.node_rank << ", host " << host
      << ", pid " << s.pid << ") " << s.describe();
  r.summary = sum.str();
  r.permanent = s.signal == 0 && s.exit_code == kWorkerUsageExit;
  std::ostringstream os;
  os << "root cause (first worker to fail): " << r.summary << " after " << static_cast<int>(s.end_time * 10) / 10.0
     << " s\n";
  if (s.signal == SIGKILL)
    os << "  (the launcher did not send that SIGKILL: the kernel's out-of-memory killer, or a kill -9 from outside)\n";
  if (auto rec = read_error_file(w.error_file)) {
    os << "  error file " << rec->path << (rec->type.empty() ? "" : " (" + rec->type + ")") << ":\n"
       << indent(rec->message, "    ");
  } else {
    os << "  no error file (the worker wrote none to INGOT_ERROR_FILE: it did not fail through an uncaught error "
          "of `ingot run`, or it was killed)\n";
  }
  std::vector<std::string> lines = g.last_lines(root, kReportLines);
  if (!lines.empty()) {
    os << "  last output lines of rank " << w.rank << ":\n";
    for (const std::string& l : lines) os << "    | " << l << "\n";
  }
  std::string others;
  for (size_t i = 0; i < g.size(); ++i) {
    if (i == root) continue;
    const WorkerStatus& o = g.status(i);
    std::string what = o.stopped_by_us && o.signal ? "was stopped (" + signal_name(o.signal) + ")" : o.describe();
    if (o.stopped_by_us && !o.signal) what = "exited with code " + std::to_string(o.exit_code) + " when stopped";
    others += (others.empty() ? "" : "; ") + ("rank " + std::to_string(g.spec(i).rank) + " " + what);
  }
  if (!others.empty()) os << "  other workers of this node: " << others << "\n";
  r.report = os.str();
  return r;
}

struct Attempt {
  const LaunchOptions& opts;
  const LocalWorld& world;
  const std::string& run_id;
  const std::string& run_dir;
  const std::vector<std::string>& gpu_ids;  // CUDA_VISIBLE_DEVICES entry per local rank (gpus only)
  Rendezvous& rdzv;
  SignalWatch& signals;
  std::ostream& log;
  std::string host;

  std::vector<WorkerSpec> specs(const NodeAssignment& a) const {
    std::vector<WorkerSpec> out;
    fs::path attempt_dir = fs::path(run_dir) / ("attempt_" + std::to_string(a.round));
    const char* omp = std::getenv("OMP_NUM_THREADS");
    int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int lr = 0; lr < world.nproc; ++lr) {
      WorkerSpec w;
      w.local_rank = lr;
      w.rank = a.rank_offset + lr;
      fs::path dir = attempt_dir / ("rank_" + std::to_string(w.rank));
      fs::create_directories(dir);
      w.stdout_path = (dir / "stdout.log").string();
      w.stderr_path = (dir / "stderr.log").string();
      w.error_file = (dir / "error.json").string();
      fs::remove(w.error_file);  // a file left by an earlier run in the same --log-dir is not this run's error
      int red = opts.redirects.for_rank(lr), tee = opts.tee.for_rank(lr);
      w.redirect_stdout = red & kStdout;
      w.redirect_stderr = red & kStderr;
      w.tee_stdout = tee & kStdout;
      w.tee_stderr = tee & kStderr;
      std::map<std::string, std::string> vars = {
          {"RANK", std::to_string(w.rank)},
          {"LOCAL_RANK", std::to_string(lr)},
          {"WORLD_SIZE", std::to_string(a.world_size)},
          {"LOCAL_WORLD_SIZE", std::to_string(world.nproc)},
          {"GROUP_RANK", std::to_string(a.node_rank)},
          {"GROUP_WORLD_SIZE", std::to_string(a.num_nodes)},
          {"ROLE_NAME", "default"},
          {"ROLE_RANK", std::to_string(w.rank)},
          {"ROLE_WORLD_SIZE", std::to_string(a.world_size)},
          {"MASTER_ADDR", rdzv.store_host()},
          {"MASTER_PORT", std::to_string(rdzv.store_port())},
          {"INGOT_USE_AGENT_STORE", "1"},
          {"INGOT_RESTART_COUNT", std::to_string(a.round)},
          {"INGOT_MAX_RESTARTS", std::to_string(opts.max_restarts)},
          {"INGOT_RUN_ID", run_id},
          {"INGOT_ERROR_FILE", w.error_file},
      };
      if (opts.collective_timeout_s > 0) vars["INGOT_COLLECTIVE_TIMEOUT_S"] = seconds_text(opts.collective_timeout_s);
      if (opts.init_timeout_s > 0) vars["INGOT_INIT_TIMEOUT_S"] = seconds_text(opts.init_timeout_s);
      // N CPU workers on one node would each start one OpenMP thread per core; share the cores instead.
      if (!omp) vars["OMP_NUM_THREADS"] = std::to_string(std::max(1, cpus / world.nproc));
      if (world.gpus) vars["CUDA_VISIBLE_DEVICES"] = gpu_ids.at(lr);
      // The address Gloo's sockets bind to: --local-addr, or loopback when the whole job is on this node (the
      // host name may not resolve inside a container); multi-node runs without it use the host name.
      if (!std::getenv("INGOT_GLOO_HOSTNAME")) {
        if (!opts.local_addr.empty()) vars["INGOT_GLOO_HOSTNAME"] = opts.local_addr;
        else if (a.num_nodes == 1) vars["INGOT_GLOO_HOSTNAME"] = "127.0.0.1";
      }
      w.env = worker_env(vars);
      out.push_back(std::move(w));
    }
    return out;
  }

  AttemptResult run(const NodeAssignment& a) {
    WorkerGroup g(opts.command, specs(a));
    try {
      return monitor(g, a);
    } catch (const Error&) {
      // The store went away (or another launcher broke the protocol): stop our workers gently, then report.
      g.stop(SIGTERM, opts.stop_timeout_s, signals);
      throw;
    }
  }

  AttemptResult monitor(WorkerGroup& g, const NodeAssignment& a) {
    log << "ingot launch: attempt " << a.round << " of at most " << opts.max_restarts + 1 << ": node " << a.node_rank
        << " of " << a.num_nodes << ", ranks " << a.rank_offset << ".." << a.rank_offset + world.nproc - 1
        << " of world size " << a.world_size << std::endl;
    g.start();
    bool local_done = false;
    const bool multi = a.num_nodes > 1;
    double next_store_check = 0;
    while (true) {
      g.poll(opts.monitor_interval_s, signals);
      if (signals.stop_requests() > 0) {
        AttemptResult r;
        r.outcome = Outcome::kInterrupted;
        r.signal = signals.first_stop_signal();
        log << "ingot launch: received " << signal_name(r.signal) << ", stopping " << g.size() << " worker(s)"
            << std::endl;
        g.stop(r.signal, opts.stop_timeout_s, signals);
        r.summary = "node " + std::to_string(a.node_rank) + " (host " + host + ") was interrupted by " +
                    signal_name(r.signal);
        return r;
      }
      if (g.any_failed()) {
        // A failure often brings its peers down within milliseconds (a closed socket), and the first to be reaped
        // need not be the first that failed: give the others up to a second to fail on their own and write their
        // error files, whose timestamps then decide the root cause.
        const double settle_until = seconds_now() + 1.0;
        while (!g.all_exited() && seconds_now() < settle_until && signals.stop_requests() == 0)
          g.poll(0.05, signals);
        size_t root = choose_root_cause(g);
        // The other nodes hear of it before our workers are stopped (which may take the whole grace period).
        std::string summary = describe_failure(g, root, a, host).summary;
        std::string first = multi ? rdzv.report_failure(a.round, summary) : summary;
        g.stop(SIGTERM, opts.stop_timeout_s, signals);
        AttemptResult r = describe_failure(g, root, a, host);
        log << "ingot launch: worker failed; stopped all workers of this node\n" << r.report;
        if (first != r.summary) log << "  (another node reported a failure first: " << first << ")\n";
        log.flush();
        return r;
      }
      if (!local_done && g.all_exited()) {
        local_done = true;
        if (!multi) return {};
        rdzv.report_done(a.round);
      }
      if (multi && seconds_now() >= next_store_check) {
        // Chatty workers wake the loop often; the store is asked once per monitor interval at most.
        next_store_check = seconds_now() + opts.monitor_interval_s;
        std::optional<std::string> f = rdzv.failure(a.round);
        if (!f) f = rdzv.final_failure();
        if (f) {
          g.stop(SIGTERM, opts.stop_timeout_s, signals);
          log << "ingot launch: a worker on another node failed: " << *f << "; stopped all workers of this node"
              << std::endl;
          AttemptResult r;
          r.outcome = Outcome::kFailed;
          r.summary = *f;
          return r;
        }
        if (local_done && rdzv.all_done(a)) return {};
      }
    }
  }
};

}  // namespace

int run_launcher(const LaunchOptions& opts, std::ostream& log) {
  bool wants_gpus = opts.nproc_per_node == "gpu" || opts.nproc_per_node == "auto";
  int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  LocalWorld world = resolve_nproc(opts.nproc_per_node, wants_gpus ? cuda_device_count() : 0, cpus);
  try {
    find_program(opts.command.at(0));
  } catch (const Error& e) {
    throw LaunchUsageError(e.what());
  }
  std::string run_id = !opts.rdzv_id.empty() ? opts.rdzv_id : opts.max_nodes > 1 ? "none" : make_run_id();

  // Logs and error files live in --log-dir, else in a scratch directory that is removed after a successful
  // job unless it holds redirected output; a failure report points into it, so a failed job keeps it.
  bool keep_dir = !opts.log_dir.empty() || opts.redirects.all || opts.tee.all || !opts.redirects.per_rank.empty() ||
                  !opts.tee.per_rank.empty();
  std::string run_dir = opts.log_dir;
  if (run_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/ingot_launch_" + run_id + "_XXXXXX";
    INGOT_CHECK(mkdtemp(templ.data()) != nullptr, "cannot create a directory ", templ, ": ",
                strerror(errno));
    run_dir = templ;
  }
  fs::create_directories(run_dir);
  struct DirCleanup {
    std::string dir;
    bool keep;
    ~DirCleanup() {
      std::error_code ec;
      if (!keep) fs::remove_all(dir, ec);
    }
  } cleanup{run_dir, keep_dir};

  SignalWatch signals;
  int exit_code = kLaunchFailed;
  std::optional<Rendezvous> rdzv;
  int num_nodes = 1;
  try {
    rdzv.emplace(opts, run_id, world.nproc, signals);
    log << "ingot launch: run " << run_id << ", " << world.nproc << (world.gpus ? " GPU" : "")
        << " worker(s) on this node, store " << rdzv->store_host() << ":" << rdzv->store_port()
        << (rdzv->hosting() ? " (hosted here)" : "") << ", logs " << run_dir
        << (keep_dir ? "" : " (removed if the job succeeds)") << std::endl;
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    std::vector<std::string> gpu_ids =
        world.gpus ? gpu_assignment(world.nproc, visible ? visible : "") : std::vector<std::string>{};
    Attempt attempt{opts, world, run_id, run_dir, gpu_ids, *rdzv, signals, log,
                    opts.local_addr.empty() ? local_hostname() : opts.local_addr};
    for (int round = 0;; ++round) {
      NodeAssignment a = rdzv->join(round);
      num_nodes = a.num_nodes;
      AttemptResult r = attempt.run(a);
      if (r.outcome == Outcome::kFailed) cleanup.keep = true;
      if (r.outcome == Outcome::kSucceeded) {
        log << "ingot launch: all " << a.world_size << " worker(s) succeeded (attempt " << round << ")" << std::endl;
        exit_code = kLaunchOk;
        break;
      }
      if (r.outcome == Outcome::kInterrupted) {
        if (num_nodes > 1) rdzv->report_final(r.summary);
        exit_code = 128 + r.signal;
        break;
      }
      if (std::optional<std::string> f = rdzv->final_failure()) {
        log << "ingot launch: the job was ended by another node: " << *f << std::endl;
        break;
      }
      if (r.permanent) {
        std::string why = "the root cause exited with code " + std::to_string(kWorkerUsageExit) +
                          " (a usage or config error, which fails the same way on every restart), so the group is "
                          "not restarted; root cause: " + r.summary;
        if (num_nodes > 1) rdzv->report_final(why);
        log << "ingot launch: giving up: " << why << std::endl;
        break;
      }
      if (round >= opts.max_restarts) {
        std::string why = "worker group failed and no restarts are left (--max-restarts " +
                          std::to_string(opts.max_restarts) + ", " + std::to_string(round + 1) +
                          " attempt(s)); root cause: " + r.summary;
        if (num_nodes > 1) rdzv->report_final(why);
        log << "ingot launch: giving up: " << why << std::endl;
        break;
      }
      log << "ingot launch: restarting the worker group (restart " << round + 1 << " of at most "
          << opts.max_restarts << ")" << std::endl;
    }
  } catch (const Interrupted& i) {
    log << "ingot launch: received " << signal_name(i.signal) << " while waiting for the other nodes" << std::endl;
    exit_code = 128 + i.signal;
  } catch (const Error& e) {
    // Rendezvous failures and a lost store end the job here, after the workers were stopped, so that the
    // other nodes still learn about it below.
    log << "ingot launch: error: " << e.what() << std::endl;
    exit_code = kLaunchFailed;
    cleanup.keep = true;
    try {
      if (rdzv && opts.max_nodes > 1) rdzv->report_final(local_hostname() + ": " + e.what());
    } catch (const Error&) {
    }
  }
  try {
    if (rdzv) rdzv->leave(num_nodes, 30);
  } catch (const Error&) {
    // The job's outcome is already decided; a store that went away at the very end changes nothing.
  }
  if (cleanup.keep && opts.log_dir.empty())
    log << "ingot launch: worker logs" << (exit_code == kLaunchOk ? "" : " and error files") << " are kept in "
        << run_dir << std::endl;
  return exit_code;
}

}  // namespace ingot::distributed::launch
