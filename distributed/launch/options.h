// `ingot launch` command line: torchrun's flags with torchrun's meaning, parsed into LaunchOptions by CLI11 from
// one table of flags (options.cpp), which also generates --help. Parsing checks every flag (range, form,
// combination) before anything starts; a bad flag is a LaunchUsageError naming the flag and what was expected.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace ingot::distributed::launch {

// A bad command line: the launcher prints it with a pointer to --help and exits 2.
struct LaunchUsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Which worker streams go to log files (--redirects) or to both log files and the console (--tee).
enum Streams : int { kNone = 0, kStdout = 1, kStderr = 2, kBoth = 3 };

// "3" (every local rank) or "0:1,1:2" (per local rank, others kNone), as torchrun.
struct StreamSpec {
  int all = kNone;
  std::map<int, int> per_rank;
  int for_rank(int local_rank) const;
};

struct LaunchOptions {
  std::string nproc_per_node = "1";  // N, "gpu", "cpu" or "auto"; resolved by resolve_nproc()
  int min_nodes = 1, max_nodes = 1;  // --nnodes N or MIN:MAX
  int node_rank = 0;                 // static rendezvous only
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port (single node only)
  std::string rdzv_endpoint;           // host:port; set = dynamic rendezvous through the store there
  std::string rdzv_id;                 // job id shared by the nodes; empty = generated (single node)
  std::map<std::string, std::string> rdzv_conf;  // --rdzv-conf join_timeout=600,last_call_timeout=30
  int max_restarts = 0;
  double monitor_interval_s = 0.1;
  double stop_timeout_s = 30;  // grace between SIGTERM and SIGKILL when stopping workers
  // Exported to workers as INGOT_COLLECTIVE_TIMEOUT_S / INGOT_INIT_TIMEOUT_S when set (0: not set).
  double collective_timeout_s = 0, init_timeout_s = 0;
  bool standalone = false;
  std::string log_dir;
  StreamSpec redirects, tee;
  std::string local_addr;
  std::vector<std::string> command;  // the worker program and its arguments
  bool help = false;                 // -h/--help was given: print kLaunchHelp, nothing else is checked

  bool dynamic() const { return !rdzv_endpoint.empty(); }
  double join_timeout_s() const;       // how long a node waits for the others (rdzv_conf join_timeout)
  double last_call_timeout_s() const;  // MIN:MAX: extra wait for more nodes once MIN joined
};

// Parses the arguments after `ingot launch`. Throws LaunchUsageError.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);

// The number of workers on this node and whether they are pinned to GPUs: N as given; "gpu" = one per visible
// GPU (error without one), "cpu" = one per CPU core, "auto" = GPUs if any, else CPU cores.
struct LocalWorld {
  int nproc = 1;
  bool gpus = false;
};
LocalWorld resolve_nproc(const std::string& spec, int num_gpus, int num_cpus);

// The CUDA_VISIBLE_DEVICES value of each local worker when workers are pinned to GPUs: worker i gets the i-th
// device the launcher sees (the i-th entry of the launcher's own CUDA_VISIBLE_DEVICES when set, else i).
std::vector<std::string> gpu_assignment(int nproc, const std::string& launcher_visible_devices);

// `ingot launch --help`: the prose and every flag of the parser's table, by group.
std::string launch_help();
extern const char* const kLaunchHelp;  // launch_help()

}  // namespace ingot::distributed::launch
