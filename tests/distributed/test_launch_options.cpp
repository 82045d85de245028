// `ingot launch` flag parsing (distributed/launch/options.cpp) and the JSON error file
// (distributed/launch/error_file.cpp).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <nlohmann/json.hpp>
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
