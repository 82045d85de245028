// `ingot launch` flag parsing (distributed/launch/options.cpp) and the JSON error file
// (distributed/launch/error_file.cpp).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/launch/error_file.h"
#include "distributed/launch/options.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::distributed::launch {
namespace {

using Args = std::vector<std::string>;

TEST(LaunchOptions, ParsesEveryTorchrunFlagAndTheCommandAfterDoubleDash) {
  LaunchOptions o = parse_launch_args(
      {"--nproc-per-node", "4", "--nnodes=2:3", "--rdzv-endpoint", "node0:1234", "--rdzv-id", "job7",
       "--rdzv-conf", "join_timeout=5,last_call_timeout=0.5", "--max-restarts", "3", "--monitor-interval", "0.25",
       "--stop-timeout", "2", "--log-dir", "/tmp/x", "--redirects", "3", "--tee", "0:1,2:2", "--local-addr",
       "10.0.0.2", "--", "ingot", "run", "cfg.yaml", "--summary", "s.json"});
  EXPECT_EQ(o.nproc_per_node, "4");
  EXPECT_EQ(o.min_nodes, 2);
  EXPECT_EQ(o.max_nodes, 3);
  EXPECT_EQ(o.rdzv_endpoint, "node0:1234");
  EXPECT_TRUE(o.dynamic());
  EXPECT_EQ(o.rdzv_id, "job7");
  EXPECT_DOUBLE_EQ(o.join_timeout_s(), 5);
  EXPECT_DOUBLE_EQ(o.last_call_timeout_s(), 0.5);
  EXPECT_EQ(o.max_restarts, 3);
  EXPECT_DOUBLE_EQ(o.monitor_interval_s, 0.25);
  EXPECT_DOUBLE_EQ(o.stop_timeout_s, 2);
  EXPECT_EQ(o.log_dir, "/tmp/x");
  EXPECT_EQ(o.redirects.for_rank(0), kBoth);
  EXPECT_EQ(o.redirects.for_rank(7), kBoth);
  EXPECT_EQ(o.tee.for_rank(0), kStdout);
  EXPECT_EQ(o.tee.for_rank(1), kNone);
  EXPECT_EQ(o.tee.for_rank(2), kStderr);
  EXPECT_EQ(o.local_addr, "10.0.0.2");
  EXPECT_EQ(o.command, (Args{"ingot", "run", "cfg.yaml", "--summary", "s.json"}));
}

TEST(LaunchOptions, StaticFlagsUnderscoreSpellingsAndACommandWithoutDoubleDash) {
  LaunchOptions o = parse_launch_args({"--nproc_per_node=gpu", "--nnodes", "2", "--node_rank", "1",
                                       "--master_addr", "10.1.1.1", "--master-port", "29500", "python", "-u", "t.py"});
  EXPECT_EQ(o.nproc_per_node, "gpu");
  EXPECT_EQ(o.min_nodes, 2);
  EXPECT_EQ(o.max_nodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "10.1.1.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_FALSE(o.dynamic());
  EXPECT_EQ(o.command, (Args{"python", "-u", "t.py"}));  // "-u" belongs to the command, not to the launcher
}

TEST(LaunchOptions, DefaultsAreOneLocalWorkerOnAFreePort) {
  LaunchOptions o = parse_launch_args({"--", "true"});
  EXPECT_EQ(o.nproc_per_node, "1");
  EXPECT_EQ(o.max_nodes, 1);
  EXPECT_EQ(o.master_port, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_DOUBLE_EQ(o.monitor_interval_s, 0.1);
  EXPECT_TRUE(o.rdzv_id.empty());
  EXPECT_EQ(parse_launch_args({"--rdzv-endpoint", "h", "x"}).rdzv_endpoint, "h:29400");
  EXPECT_EQ(parse_launch_args({"--rdzv-endpoint", "h", "x"}).rdzv_id, "none");
  EXPECT_TRUE(parse_launch_args({"--standalone", "x"}).standalone);
  EXPECT_TRUE(parse_launch_args({"--help"}).help);
}

TEST(LaunchOptions, BadFlagsAreNamedWithWhatWasExpected) {
  struct Case {
    Args args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{}, "missing the worker command"},
      {{"--nproc-per-node", "4"}, "missing the worker command"},
      {{"--nproc-per-node", "0", "x"}, "--nproc-per-node: expected a positive number, gpu, cpu or auto, got '0'"},
      {{"--nproc-per-node", "many", "x"}, "--nproc-per-node: expected a positive number, gpu, cpu or auto"},
      {{"--nproc-per-node"}, "--nproc-per-node needs a value"},
      {{"--nnodes", "3:2", "x"}, "--nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX, got '3:2'"},
      {{"--nnodes", "0", "x"}, "--nnodes: expected N or MIN:MAX"},
      {{"--nnodes", "1:2", "x"}, "a node range needs --rdzv-endpoint"},
      {{"--nnodes", "2", "--master-port", "5", "--node-rank", "2", "x"},
       "--node-rank 2 is out of range for --nnodes 2 (expected 0..1)"},
      {{"--nnodes", "2", "x"}, "needs --master-port (or --rdzv-endpoint)"},
      {{"--master-port", "70000", "x"}, "--master-port: expected a port 0..65535"},
      {{"--master-port", "-1", "x"}, "--master-port: expected a port 0..65535"},
      {{"--rdzv-endpoint", "host:0", "x"}, "--rdzv-endpoint port: expected a port 1..65535, got '0'"},
      {{"--rdzv-endpoint", ":80", "x"}, "--rdzv-endpoint: expected HOST[:PORT]"},
      {{"--rdzv-endpoint", "h:1", "--master-port", "2", "x"}, "give only one"},
      {{"--rdzv-id", "a/b", "x"}, "--rdzv-id: expected a non-empty id without '/'"},
      {{"--rdzv-conf", "timeout=3", "x"}, "--rdzv-conf: expected join_timeout=SECONDS"},
      {{"--rdzv-backend", "etcd", "x"}, "--rdzv-backend: expected c10d or static"},
      {{"--max-restarts", "-1", "x"}, "--max-restarts: expected a count >= 0, got '-1'"},
      {{"--monitor-interval", "0", "x"}, "--monitor-interval: expected a number of seconds > 0, got '0'"},
      {{"--monitor-interval", "1s", "x"}, "--monitor-interval: expected a number of seconds"},
      {{"--stop-timeout", "-2", "x"}, "--stop-timeout: expected a number of seconds >= 0"},
      {{"--redirects", "4", "x"}, "--redirects: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"},
      {{"--tee", "0:1,x:2", "x"}, "--tee: expected LOCAL_RANK:STREAMS items"},
      {{"--standalone", "--nnodes", "2", "x"}, "--standalone is a single-node run"},
      {{"--standalone", "--rdzv-endpoint", "h:1", "x"}, "--standalone starts its own store"},
      {{"--standalone=1", "x"}, "--standalone takes no value"},
      {{"--log-dir", "/etc/hostname", "x"}, "--log-dir: '/etc/hostname' exists and is not a directory"},
      {{"--nproc-per-nod", "2", "x"}, "unknown option '--nproc-per-nod' (did you mean --nproc-per-node?)"},
      {{"--frobnicate", "x"}, "unknown option '--frobnicate'"},
  };
  for (const Case& c : cases) {
    std::string all;
    for (const auto& a : c.args) all += a + " ";
    try {
      parse_launch_args(c.args);
      ADD_FAILURE() << "no error for: " << all;
    } catch (const LaunchUsageError& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos)
          << "args: " << all << "\n  got: " << e.what() << "\n  expected to contain: " << c.message;
    }
  }
}

// The flags --help lists, read back from the help text ("  --flag VALUE  text" lines).
std::vector<std::string> flags_in_help(const std::string& help) {
  std::vector<std::string> flags;
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("  --", 0) != 0) continue;
    size_t end = line.find(' ', 2);
    flags.push_back(line.substr(2, end == std::string::npos ? std::string::npos : end - 2));
  }
  return flags;
}

TEST(LaunchOptions, HelpListsEveryFlagTheParserTakesAndEveryListedFlagParses) {
  const std::string help = launch_help();
  EXPECT_EQ(help, kLaunchHelp);
  EXPECT_EQ(help.rfind("Usage: ingot launch [options] [--] COMMAND [ARGS ...]\n", 0), 0u) << help;
  const std::vector<std::string> every_flag = {
      "--nproc-per-node", "--nnodes",       "--node-rank",        "--master-addr",  "--master-port",
      "--rdzv-endpoint",  "--rdzv-id",      "--rdzv-conf",        "--rdzv-backend", "--standalone",
      "--local-addr",     "--max-restarts", "--monitor-interval", "--stop-timeout", "--collective-timeout",
      "--init-timeout",   "--log-dir",      "--redirects",        "--tee"};
  std::vector<std::string> listed = flags_in_help(help);
  for (const std::string& flag : every_flag)
    EXPECT_NE(std::find(listed.begin(), listed.end(), flag), listed.end()) << flag << " missing from:\n" << help;
  EXPECT_NE(help.find("  -h, --help "), std::string::npos) << help;
  EXPECT_NE(help.find("  --nproc-per-node N|gpu|cpu|auto "), std::string::npos) << help;
  EXPECT_NE(help.find("Exit status"), std::string::npos) << help;
  // Each listed flag is one the parser knows (none is unknown; a bad value names the flag instead).
  for (const std::string& flag : listed) {
    if (flag == "--help") continue;
    try {
      parse_launch_args({flag + "=@bad@", "x"});
    } catch (const LaunchUsageError& e) {
      std::string msg = e.what();
      EXPECT_EQ(msg.find("unknown option"), std::string::npos) << flag << ": " << msg;
      EXPECT_NE(msg.find(flag), std::string::npos) << flag << ": " << msg;
    }
  }
  EXPECT_TRUE(parse_launch_args({"-h"}).help);
  EXPECT_TRUE(parse_launch_args({"--nproc-per-node", "2", "--help", "--frobnicate"}).help);
  EXPECT_FALSE(parse_launch_args({"--", "--help"}).help) << "after -- it is the worker's --help";
}

TEST(LaunchOptions, DashAndUnderscoreSpellingsParseTheSame) {
  const std::vector<std::pair<std::string, std::string>> flags = {
      {"--nproc-per-node", "3"},  {"--node-rank", "1"},          {"--master-addr", "10.0.0.1"},
      {"--master-port", "29500"}, {"--max-restarts", "2"},       {"--monitor-interval", "0.5"},
      {"--stop-timeout", "4"},    {"--collective-timeout", "7"}, {"--init-timeout", "9"},
      {"--log-dir", "/tmp/l"},    {"--local-addr", "h1"},        {"--rdzv-backend", "c10d"}};
  Args dashed = {"--nnodes", "2"}, underscored = {"--nnodes", "2"};
  for (const auto& [flag, value] : flags) {
    std::string under = flag;
    std::replace(under.begin() + 2, under.end(), '-', '_');
    dashed.insert(dashed.end(), {flag, value});
    underscored.push_back(under + "=" + value);
  }
  dashed.insert(dashed.end(), {"--", "w", "--max_restarts", "5"});
  underscored.insert(underscored.end(), {"w", "--max_restarts", "5"});
  LaunchOptions a = parse_launch_args(dashed), b = parse_launch_args(underscored);
  for (const LaunchOptions* o : {&a, &b}) {
    EXPECT_EQ(o->nproc_per_node, "3");
    EXPECT_EQ(o->max_nodes, 2);
    EXPECT_EQ(o->node_rank, 1);
    EXPECT_EQ(o->master_addr, "10.0.0.1");
    EXPECT_EQ(o->master_port, 29500);
    EXPECT_EQ(o->max_restarts, 2);
    EXPECT_DOUBLE_EQ(o->monitor_interval_s, 0.5);
    EXPECT_DOUBLE_EQ(o->stop_timeout_s, 4);
    EXPECT_DOUBLE_EQ(o->collective_timeout_s, 7);
    EXPECT_DOUBLE_EQ(o->init_timeout_s, 9);
    EXPECT_EQ(o->log_dir, "/tmp/l");
    EXPECT_EQ(o->local_addr, "h1");
    EXPECT_EQ(o->command, (Args{"w", "--max_restarts", "5"})) << "the worker's flags stay the worker's";
  }
  EXPECT_EQ(parse_launch_args({"--rdzv_endpoint", "h:5", "--rdzv_id=j", "--rdzv_conf", "join_timeout=3", "x"}).rdzv_id,
            "j");
  EXPECT_TRUE(parse_launch_args({"--standalone", "x"}).standalone);
  EXPECT_EQ(parse_launch_args({"--nproc-per_node", "2", "x"}).nproc_per_node, "2") << "mixed spellings too";
  // A bad value names the flag in its dash spelling, whichever spelling was typed.
  for (const std::string& spelling : {"--max-restarts", "--max_restarts"}) {
    try {
      parse_launch_args({spelling, "x1", "cmd"});
      ADD_FAILURE() << spelling;
    } catch (const LaunchUsageError& e) {
      EXPECT_STREQ(e.what(), "--max-restarts: expected a count >= 0, got 'x1'");
    }
  }
}

TEST(LaunchOptions, TheCommandAndEverythingAfterItReachTheWorkersUntouched) {
  EXPECT_EQ(parse_launch_args({"--nnodes", "1", "python", "t.py", "--nproc-per-node", "9", "--", "-h"}).command,
            (Args{"python", "t.py", "--nproc-per-node", "9", "--", "-h"}));
  EXPECT_EQ(parse_launch_args({"--", "--", "x", "--frobnicate"}).command, (Args{"--", "x", "--frobnicate"}));
  EXPECT_EQ(parse_launch_args({"--", "-x", ""}).command, (Args{"-x", ""}));
  EXPECT_EQ(parse_launch_args({"-", "a"}).command, (Args{"-", "a"}));
}

TEST(LaunchOptions, ARepeatedFlagsLastValueWinsAndRdzvConfItemsAccumulate) {
  LaunchOptions o = parse_launch_args({"--max-restarts", "1", "--max_restarts=4", "--rdzv-endpoint", "h", "--rdzv-conf",
                                       "join_timeout=5", "--rdzv-conf", "last_call_timeout=2", "x"});
  EXPECT_EQ(o.max_restarts, 4);
  EXPECT_DOUBLE_EQ(o.join_timeout_s(), 5);
  EXPECT_DOUBLE_EQ(o.last_call_timeout_s(), 2);
}

TEST(LaunchOptions, NprocPerNodeResolvesGpuCpuAndAuto) {
  EXPECT_EQ(resolve_nproc("3", 8, 16).nproc, 3);
  EXPECT_FALSE(resolve_nproc("3", 8, 16).gpus);
  EXPECT_EQ(resolve_nproc("gpu", 4, 16).nproc, 4);
  EXPECT_TRUE(resolve_nproc("gpu", 4, 16).gpus);
  EXPECT_EQ(resolve_nproc("cpu", 4, 16).nproc, 16);
  EXPECT_FALSE(resolve_nproc("cpu", 4, 16).gpus);
  EXPECT_EQ(resolve_nproc("auto", 2, 16).nproc, 2);
  EXPECT_TRUE(resolve_nproc("auto", 2, 16).gpus);
  EXPECT_EQ(resolve_nproc("auto", 0, 6).nproc, 6);
  EXPECT_FALSE(resolve_nproc("auto", 0, 6).gpus);
  try {
    resolve_nproc("gpu", 0, 6);
    ADD_FAILURE() << "gpu without GPUs must fail";
  } catch (const LaunchUsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--nproc-per-node gpu: no CUDA device is visible"), std::string::npos)
        << e.what();
  }
}

TEST(LaunchOptions, GpuWorkersGetOneVisibleDeviceEachFromTheLaunchersOwnList) {
  EXPECT_EQ(gpu_assignment(3, ""), (Args{"0", "1", "2"}));
  EXPECT_EQ(gpu_assignment(2, "4,6,7"), (Args{"4", "6"}));
  EXPECT_EQ(gpu_assignment(2, "GPU-aa,GPU-bb"), (Args{"GPU-aa", "GPU-bb"}));
  EXPECT_THROW(gpu_assignment(3, "1,2"), Error);
}

class LaunchErrorFile : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = getenv("INGOT_ERROR_FILE")) saved_ = v;
  }
  void TearDown() override {
    if (saved_.empty()) unsetenv("INGOT_ERROR_FILE");
    else setenv("INGOT_ERROR_FILE", saved_.c_str(), 1);
  }
  std::string saved_;
  TempDir dir_{"ingot_error_file_test"};
};

TEST_F(LaunchErrorFile, RecordErrorWritesJsonThatReadsBackAndKeepsTheFirstError) {
  std::string path = dir_.file("error.json");
  setenv("INGOT_ERROR_FILE", path.c_str(), 1);
  record_error("matmul: inner dims differ: 3 vs 4", "error");
  record_error("a later error", "error");
  nlohmann::json j = nlohmann::json::parse(read_file(path));
  EXPECT_EQ(j["message"], "matmul: inner dims differ: 3 vs 4");
  EXPECT_EQ(j["pid"], static_cast<long>(getpid()));
  EXPECT_GT(j["timestamp"].get<double>(), 1.6e9);
  auto rec = read_error_file(path);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->message, "matmul: inner dims differ: 3 vs 4");
  EXPECT_EQ(rec->type, "error");
  EXPECT_EQ(rec->pid, static_cast<long>(getpid()));
  EXPECT_FALSE(rec->host.empty());
}

TEST_F(LaunchErrorFile, NothingIsWrittenOutsideTheLauncherAndOtherContentIsShownAsText) {
  unsetenv("INGOT_ERROR_FILE");
  record_error("lost", "error");  // no path: nothing to do, and no exception
  EXPECT_FALSE(read_error_file(dir_.file("missing.json")).has_value());
  std::ofstream(dir_.file("plain.txt")) << "Traceback: something broke\n";
  auto rec = read_error_file(dir_.file("plain.txt"));
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->message, "Traceback: something broke");
  EXPECT_EQ(rec->timestamp, 0);
  std::ofstream(dir_.file("empty.json")) << "\n";
  EXPECT_FALSE(read_error_file(dir_.file("empty.json")).has_value());
}

}  // namespace
}  // namespace ingot::distributed::launch
