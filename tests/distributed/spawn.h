// Multi-process tests: a test re-runs itself in N fresh processes (fork + exec of this test binary, filtered to
// the current test), each with the env:// variables a launcher would export. Fresh processes, not bare forks:
// OpenMP's thread pool and Gloo's threads do not survive fork(), and exec tests the real bootstrap path.
//
//   TEST(Suite, Name) {
//     if (ingot::testing::is_rank_process()) { ...the per-rank body, using EXPECT_*...; return; }
//     ingot::testing::expect_ranks_pass(ingot::testing::spawn_ranks(ingot::testing::world(4)));
//   }
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distributed/bootstrap.h"
#include "distributed/store.h"

namespace ingot::testing {

inline bool is_rank_process() {
  const char* v = std::getenv("INGOT_TEST_RANK_PROCESS");
  return v && std::string(v) == "1";
}

inline int env_rank() {
  const char* v = std::getenv("RANK");
  if (v) return std::atoi(v);
  v = std::getenv("OMPI_COMM_WORLD_RANK");
  return v ? std::atoi(v) : 0;
}

struct SpawnOptions {
  int world = 2;
  std::vector<int> ranks;          // which ranks to start (default: all)
  bool agent_store = true;         // the test process hosts the store (as `ingot launch` does); else rank 0
  std::map<std::string, std::string> env;
  std::chrono::milliseconds timeout{15000};
  bool mpirun = false;             // start through `mpirun -np world` instead (no RANK/MASTER_* exported)

  // Chainable setters: spawn_ranks(world(3).rank0_hosts_store().within(30s)).
  SpawnOptions& only(std::vector<int> r) { ranks = std::move(r); return *this; }
  SpawnOptions& rank0_hosts_store() { agent_store = false; return *this; }
  SpawnOptions& within(std::chrono::milliseconds t) { timeout = t; return *this; }
  SpawnOptions& via_mpirun() { mpirun = true; return *this; }
};

inline SpawnOptions world(int n) {
  SpawnOptions o;
  o.world = n;
  return o;
}

struct RankResult {
  int rank = 0;
  int exit_code = -1;  // -1: killed by a signal or by the timeout
  bool timed_out = false;
  std::string output;
};

inline std::string current_test_filter() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->test_suite_name()) + "." + info->name();
}

inline std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

inline std::string find_in_path(const std::string& prog) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && access((dir + "/" + prog).c_str(), X_OK) == 0) return dir + "/" + prog;
  return "";
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Starts the ranks and waits for all of them (killing all at the timeout). The caller checks the results.
inline std::vector<RankResult> spawn_ranks(const SpawnOptions& opt) {
  std::unique_ptr<distributed::TcpStoreServer> server;
  int port;
  if (opt.agent_store) {
    server = std::make_unique<distributed::TcpStoreServer>(0, "127.0.0.1");
    port = server->port();
  } else {
    distributed::TcpStoreServer probe(0, "127.0.0.1");  // a port free a moment ago, for rank 0 to bind
    port = probe.port();
  }
  std::vector<int> ranks = opt.ranks;
  if (opt.mpirun) ranks = {0};
  if (ranks.empty())
    for (int r = 0; r < opt.world; ++r) ranks.push_back(r);
  std::string exe = self_exe(), filter = "--gtest_filter=" + current_test_filter();
  char tmpl[] = "/tmp/ingot_spawn_XXXXXX";
  std::string dir = mkdtemp(tmpl) ? tmpl : "/tmp";
  std::vector<RankResult> results;
  std::vector<pid_t> pids;
  for (int r : ranks) {
    RankResult res;
    res.rank = r;
    std::string log = dir + "/rank" + std::to_string(r) + ".log";
    std::map<std::string, std::string> env = opt.env;
    env["INGOT_TEST_RANK_PROCESS"] = "1";
    env["OMP_NUM_THREADS"] = "1";
    env["INGOT_GLOO_HOSTNAME"] = "127.0.0.1";
    std::vector<std::string> argv;
    if (opt.mpirun) {
      argv = {find_in_path("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(opt.world)};
      for (const auto& [k, v] : env) argv.insert(argv.end(), {"-x", k + "=" + v});
      argv.insert(argv.end(), {"-x", "PATH"});
    } else {
      env["RANK"] = std::to_string(r);
      env["WORLD_SIZE"] = std::to_string(opt.world);
      env["LOCAL_RANK"] = std::to_string(r);
      env["LOCAL_WORLD_SIZE"] = std::to_string(opt.world);
      env["MASTER_ADDR"] = "127.0.0.1";
      env["MASTER_PORT"] = std::to_string(port);
      env["INGOT_USE_AGENT_STORE"] = opt.agent_store ? "1" : "0";
    }
    argv.insert(argv.end(), {exe, filter, "--gtest_brief=1", "--gtest_color=no"});
    pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      // The child runs exactly this test: a sharded parent's shard must not filter it out.
      for (const char* k : {"GTEST_TOTAL_SHARDS", "GTEST_SHARD_INDEX", "GTEST_SHARD_STATUS_FILE", "GTEST_FILTER"})
        unsetenv(k);
      for (const auto& [k, v] : env)
        if (!opt.mpirun) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
    pids.push_back(pid);
    results.push_back(res);
  }
  auto deadline = std::chrono::steady_clock::now() + opt.timeout;
  size_t left = pids.size();
  std::vector<bool> done(pids.size(), false);
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        done[i] = true;
        --left;
        results[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        kill(-pids[i], SIGKILL);
        kill(pids[i], SIGKILL);
        waitpid(pids[i], nullptr, 0);
        done[i] = true;
        results[i].timed_out = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& res : results) {
    std::string log = dir + "/rank" + std::to_string(res.rank) + ".log";
    res.output = read_text(log);
    std::remove(log.c_str());
  }
  rmdir(dir.c_str());
  return results;
}

inline void expect_ranks_pass(const std::vector<RankResult>& results) {
  for (const auto& r : results) {
    EXPECT_FALSE(r.timed_out) << "rank " << r.rank << " did not finish in time; its output:\n" << r.output;
    EXPECT_EQ(r.exit_code, 0) << "rank " << r.rank << " failed; its output:\n" << r.output;
    // A filter that matched nothing would also exit 0: make sure the rank really ran this test.
    if (r.exit_code == 0) {
      EXPECT_NE(r.output.find("[  PASSED  ] 1 test."), std::string::npos)
          << "rank " << r.rank << " did not run the test; its output:\n" << r.output;
    }
  }
}

// What a rank process passes to init_distributed(): Gloo, with timeouts short enough that a broken test fails
// in seconds instead of hanging (a collective's `timeout`; `store_timeout` for rendezvous and store waits).
inline distributed::InitOptions gloo_test_init(std::chrono::milliseconds timeout = std::chrono::milliseconds(5000),
                                               std::chrono::milliseconds store_timeout = std::chrono::milliseconds(5000)) {
  distributed::InitOptions o;
  o.backend = "gloo";
  o.timeout = timeout;
  o.store_timeout = store_timeout;
  o.connect_timeout = std::chrono::milliseconds(5000);
  o.report_grace = std::chrono::milliseconds(500);
  return o;
}

}  // namespace ingot::testing
