// End-to-end tests of `ingot launch` (distributed/launch/): they run the built `ingot` binary (beside
// ingot_tests) with small shell scripts as workers, in a temporary directory.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "distributed/bootstrap.h"
#include "distributed/process_group.h"
#include "distributed/store.h"
#include "autograd/ops.h"
#include "runtime/device.h"
#include "runtime/file_util.h"
#include "tests/shell.h"
#include "tests/tiny_run.h"

namespace ingot::distributed::launch {
namespace {

namespace fs = std::filesystem;

using Result = ingot::testing::ShellResult;  // stdout and stderr together

using ingot::testing::bin_dir;

// Runs a shell command line in `cwd` with `ingot` meaning the built binary.
Result run_sh(const std::string& cwd, const std::string& cmd) {
  return ingot::testing::run_shell("cd '" + cwd + "' && INGOT='" + (bin_dir() / "ingot").string() + "' && (" + cmd +
                                   ") 2>&1");
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// KEY=value lines of a file.
std::map<std::string, std::string> read_vars(const std::string& path) {
  std::map<std::string, std::string> m;
  std::istringstream is(slurp(path));
  std::string line;
  while (std::getline(is, line))
    if (size_t eq = line.find('='); eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
  return m;
}

bool process_alive(pid_t pid) { return kill(pid, 0) == 0; }

// Whether this process is a worker that Launch::launch_this_test started with `mode`.
bool is_worker(const char* mode) {
  const char* v = getenv("INGOT_LAUNCH_TEST_WORKER");
  return v && std::string(v) == mode;
}

int free_port() {
  TcpStoreServer probe(0, "127.0.0.1");
  return probe.port();
}

class Launch : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(bin_dir() / "ingot")) << "build the `ingot` target too";
  }
  std::string path(const std::string& name) const { return dir_.file(name); }
  void script(const std::string& name, const std::string& body) {
    std::ofstream(dir_.file(name)) << "#!/bin/sh\n" << body;
  }
  Result launch(const std::string& args) { return run_sh(dir_.path(), "\"$INGOT\" launch " + args); }
  // `ingot launch FLAGS -- env INGOT_LAUNCH_TEST_WORKER=MODE ENV... <this binary> --gtest_filter=<this test>`:
  // the running test again as the launcher's workers, which take is_worker(MODE)'s branch.
  Result launch_this_test(const std::string& flags, const std::string& mode, const std::string& env = "") {
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    return launch(flags + " -- env INGOT_LAUNCH_TEST_WORKER=" + mode + " " + env + "'" +
                  fs::read_symlink("/proc/self/exe").string() + "' --gtest_filter=" + t->test_suite_name() + "." +
                  t->name() + " --gtest_brief=1");
  }
  TempDir dir_{"ingot_launch_test"};
};

TEST_F(Launch, ExportsRanksAndJobVariablesToEveryWorker) {
  script("env.sh",
         "for k in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK "
         "ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT INGOT_RESTART_COUNT INGOT_MAX_RESTARTS INGOT_RUN_ID "
         "INGOT_ERROR_FILE INGOT_USE_AGENT_STORE OMP_NUM_THREADS; do eval echo \"$k=\\$$k\"; done > env_$RANK.txt\n");
  Result r = launch("--nproc-per-node 4 --max-restarts 2 --rdzv-id job42 -- sh env.sh");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> error_files;
  for (int rank = 0; rank < 4; ++rank) {
    auto v = read_vars(path("env_" + std::to_string(rank) + ".txt"));
    EXPECT_EQ(v["RANK"], std::to_string(rank));
    EXPECT_EQ(v["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(v["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(v["WORLD_SIZE"], "4");
    EXPECT_EQ(v["LOCAL_WORLD_SIZE"], "4");
    EXPECT_EQ(v["ROLE_WORLD_SIZE"], "4");
    EXPECT_EQ(v["GROUP_RANK"], "0");
    EXPECT_EQ(v["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(v["MASTER_ADDR"], "127.0.0.1");
    EXPECT_GT(std::atoi(v["MASTER_PORT"].c_str()), 0);
    // The port is the store the launcher hosted (and printed).
    EXPECT_NE(r.output.find("store 127.0.0.1:" + v["MASTER_PORT"] + " (hosted here)"), std::string::npos)
        << r.output;
    EXPECT_EQ(v["INGOT_RESTART_COUNT"], "0");
    EXPECT_EQ(v["INGOT_MAX_RESTARTS"], "2");
    EXPECT_EQ(v["INGOT_RUN_ID"], "job42");
    EXPECT_EQ(v["INGOT_USE_AGENT_STORE"], "1");
    EXPECT_NE(v["INGOT_ERROR_FILE"].find("attempt_0/rank_" + std::to_string(rank) + "/error.json"),
              std::string::npos);
    EXPECT_FALSE(v["OMP_NUM_THREADS"].empty());
    error_files.insert(v["INGOT_ERROR_FILE"]);
  }
  EXPECT_EQ(error_files.size(), 4u);
  EXPECT_NE(r.output.find("all 4 worker(s) succeeded"), std::string::npos) << r.output;
}

TEST_F(Launch, WorkersReachTheStoreTheLauncherHosts) {
  // Two workers meet in the launcher's store at MASTER_ADDR:MASTER_PORT, as the process groups will.
  if (is_worker("1")) {
    TcpStore store(getenv("MASTER_ADDR"), std::atoi(getenv("MASTER_PORT")));
    int rank = std::atoi(getenv("RANK")), world = std::atoi(getenv("WORLD_SIZE"));
    store.set("test/rank" + std::to_string(rank), std::to_string(rank * 10 + 7));
    store.barrier("test/all_in", world, Millis(5000));
    int other = 1 - rank;
    EXPECT_EQ(store.get("test/rank" + std::to_string(other), Millis(1000)), std::to_string(other * 10 + 7));
    return;
  }
  Result r = launch_this_test("--nproc-per-node 2", "1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("all 2 worker(s) succeeded"), std::string::npos) << r.output;
}

// The launcher's environment is what init_distributed() needs: Gloo workers meet in the launcher's store and
// all-reduce. On the first attempt rank 1 is SIGKILLed while rank 0 waits in the collective; the launcher stops
// rank 0, restarts both, and the second attempt (fresh store keys) completes.
TEST_F(Launch, GlooWorkersAllReduceAndAKilledRankRestartsTheJob) {
  if (is_worker("gloo")) {
    InitOptions o;
    o.backend = "gloo";
    o.timeout = Millis(20000);
    o.connect_timeout = Millis(5000);
    DistributedContext ctx = init_distributed(o);
    int rank = ctx.info.rank;
    if (ctx.info.restart_count == 0 && rank == 1) raise(SIGKILL);
    Tensor t = from_vector(std::vector<double>{1.0 + rank, 10.0 * (rank + 1)}, {2}, DType::f64);
    ctx.group->all_reduce(t, ReduceOp::Sum)->wait();
    EXPECT_EQ(t.to_vector(), (std::vector<double>{3.0, 30.0}));
    std::ofstream(std::string(getenv("INGOT_LAUNCH_TEST_DIR")) + "/sum_" + std::to_string(rank))
        << t.to_vector()[1] << " attempt " << ctx.info.restart_count;
    return;
  }
#ifndef INGOT_WITH_GLOO
  GTEST_SKIP() << "built without Gloo";
#endif
  Result r = launch_this_test("--nproc-per-node 2 --max-restarts 1", "gloo",
                              "INGOT_LAUNCH_TEST_DIR='" + dir_.path() + "' ");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 (local rank 1 on node 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by SIGKILL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("all 2 worker(s) succeeded (attempt 1)"), std::string::npos) << r.output;
  EXPECT_EQ(slurp(path("sum_0")), "30 attempt 1");
  EXPECT_EQ(slurp(path("sum_1")), "30 attempt 1");
}

TEST_F(Launch, FailingWorkerStopsTheOthersAndIsReportedAsRootCauseWithItsErrorFile) {
  script("w.sh",
         "echo $$ > pid_$RANK\n"
         "if [ \"$RANK\" = 1 ]; then\n"
         "  sleep 0.3\n"
         "  echo 'loading shard 3' >&2\n"
         "  echo 'shape mismatch in layer 7' >&2\n"
         "  printf '{\"message\": \"linear: inner dims differ: 64 vs 48\", \"type\": \"error\", \"timestamp\": 1}' "
         "> \"$INGOT_ERROR_FILE\"\n"
         "  exit 3\n"
         "fi\n"
         "exec sleep 30\n");
  Result r = launch("--nproc-per-node 3 --stop-timeout 5 -- sh w.sh");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 5) << "the other workers were not stopped promptly:\n" << r.output;
  EXPECT_NE(r.output.find("root cause (first worker to fail): rank 1 (local rank 1 on node 0, host "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(") exited with code 3 after "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("linear: inner dims differ: 64 vs 48"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| shape mismatch in layer 7"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 was stopped (SIGTERM)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 2 was stopped (SIGTERM)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("giving up: worker group failed and no restarts are left (--max-restarts 0"),
            std::string::npos)
      << r.output;
  for (int rank : {0, 2}) {
    pid_t pid = std::atoi(slurp(path("pid_" + std::to_string(rank))).c_str());
    ASSERT_GT(pid, 0);
    EXPECT_FALSE(process_alive(pid)) << "rank " << rank << " still runs";
  }
}

// A rank killed by SIGPIPE wrote to a socket whose other end had gone: the consequence of a peer's death, not the
// root cause, even when it was reaped first (choose_root_cause, agent.cpp). Rank 0 dies of SIGPIPE at once, rank 1
// is SIGKILLed 0.2 s later, within the launcher's settle window: rank 1 is named.
TEST_F(Launch, ARankKilledBySigpipeIsNotTheRootCauseWhenAPeerFailedToo) {
  script("w.sh",
         "if [ \"$RANK\" = 0 ]; then kill -PIPE $$; fi\n"
         "sleep 0.2\n"
         "kill -9 $$\n");
  Result r = launch("--nproc-per-node 2 -- sh w.sh");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("root cause (first worker to fail): rank 1 (local rank 1 on node 0"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("was killed by SIGKILL (signal 9)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 was killed by SIGPIPE"), std::string::npos) << r.output;
}

// Note [Ranks ignore SIGPIPE] (bootstrap.cpp): after init_distributed a write to a socket whose reader is gone
// fails with EPIPE instead of killing the rank.
TEST_F(Launch, ARankWritingToAClosedSocketGetsAnErrorInsteadOfDying) {
  if (is_worker("pipe")) {
    InitOptions o;
    o.backend = "gloo";
    o.timeout = Millis(20000);
    DistributedContext ctx = init_distributed(o);
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    close(fds[0]);
    const char byte = 'x';
    EXPECT_EQ(write(fds[1], &byte, 1), -1);
    EXPECT_EQ(errno, EPIPE);
    close(fds[1]);
    return;
  }
#ifndef INGOT_WITH_GLOO
  GTEST_SKIP() << "built without Gloo";
#endif
  Result r = launch_this_test("--nproc-per-node 1", "pipe");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("SIGPIPE"), std::string::npos) << r.output;
}

TEST_F(Launch, WorkerKilledMidRunRestartsTheGroupAndTheSecondAttemptSucceeds) {
  script("w.sh",
         "if [ \"$INGOT_RESTART_COUNT\" = 0 ]; then\n"
         "  if [ \"$RANK\" = 1 ]; then sleep 0.2; kill -9 $$; fi\n"
         "  exec sleep 30\n"
         "fi\n"
         "echo \"attempt=$INGOT_RESTART_COUNT rank=$RANK\" > done_$RANK\n");
  Result r = launch("--nproc-per-node 2 --max-restarts 2 -- sh w.sh");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 5) << r.output;
  EXPECT_NE(r.output.find("rank 1 (local rank 1 on node 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by SIGKILL (signal 9)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restarting the worker group (restart 1 of at most 2)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("all 2 worker(s) succeeded (attempt 1)"), std::string::npos) << r.output;
  EXPECT_EQ(slurp(path("done_0")), "attempt=1 rank=0\n");
  EXPECT_EQ(slurp(path("done_1")), "attempt=1 rank=1\n");
}

TEST_F(Launch, RestartsRunOutAndTheLauncherExitsNonZeroNamingTheRootCause) {
  script("w.sh",
         "if [ \"$RANK\" = 1 ]; then exec sleep 30; fi\n"
         "echo attempt $INGOT_RESTART_COUNT >> attempts\n"
         "exit 5\n");
  Result r = launch("--nproc-per-node 2 --max-restarts 2 -- sh w.sh");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(slurp(path("attempts")), "attempt 0\nattempt 1\nattempt 2\n");
  EXPECT_NE(r.output.find("attempt 2 of at most 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("giving up: worker group failed and no restarts are left (--max-restarts 2, 3 attempt(s)); "
                          "root cause: rank "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("exited with code 5"), std::string::npos) << r.output;
}

TEST_F(Launch, SigtermOrSigintToTheLauncherStopsEveryWorker) {
  script("w.sh", "echo $$ > pid_$RANK\nexec sleep 30\n");
  for (auto [sig, code] : {std::pair{"TERM", 143}, std::pair{"INT", 130}}) {
    Result r = run_sh(dir_.path(),
                      "\"$INGOT\" launch --nproc-per-node 2 -- sh w.sh & L=$!; "
                      "n=0; while { [ ! -s pid_0 ] || [ ! -s pid_1 ]; } && [ $n -lt 100 ]; do sleep 0.05; n=$((n+1)); done; kill -" +
                          std::string(sig) + " $L; wait $L; echo launcher_exit=$?");
    EXPECT_NE(r.output.find("launcher_exit=" + std::to_string(code)), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(std::string("received SIG") + sig + ", stopping 2 worker(s)"), std::string::npos)
        << r.output;
    for (int rank : {0, 1}) {
      pid_t pid = std::atoi(slurp(path("pid_" + std::to_string(rank))).c_str());
      ASSERT_GT(pid, 0);
      EXPECT_FALSE(process_alive(pid)) << "rank " << rank << " still runs after SIG" << sig;
      fs::remove(path("pid_" + std::to_string(rank)));
    }
  }
}

TEST_F(Launch, WorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  script("w.sh",
         "trap '' TERM\n"
         "if [ \"$RANK\" = 0 ]; then sleep 0.2; exit 1; fi\n"
         "while true; do sleep 0.05; done\n");
  Result r = launch("--nproc-per-node 2 --stop-timeout 0.3 -- sh w.sh");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 4) << r.output;
  EXPECT_NE(r.output.find("rank 1 was stopped (SIGKILL)"), std::string::npos) << r.output;
}

TEST_F(Launch, LogDirKeepsPerRankLogsAndTeePrefixesLinesWithTheRank) {
  script("w.sh", "echo \"out of $RANK\"\necho \"err of $RANK\" >&2\n");
  Result r = launch("--nproc-per-node 2 --log-dir logs --redirects 3 --tee 0:2 -- sh w.sh");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(slurp(path("logs/attempt_0/rank_0/stdout.log")), "out of 0\n");
  EXPECT_EQ(slurp(path("logs/attempt_0/rank_0/stderr.log")), "err of 0\n");
  EXPECT_EQ(slurp(path("logs/attempt_0/rank_1/stdout.log")), "out of 1\n");
  EXPECT_EQ(slurp(path("logs/attempt_0/rank_1/stderr.log")), "err of 1\n");
  EXPECT_NE(r.output.find("[0]:err of 0\n"), std::string::npos) << r.output;  // teed
  EXPECT_EQ(r.output.find("out of 0"), std::string::npos) << r.output;       // redirected only
  EXPECT_EQ(r.output.find("out of 1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("err of 1"), std::string::npos) << r.output;
}

TEST_F(Launch, TwoLaunchersOnLocalhostRendezvousIntoOneWorld) {
  script("env.sh",
         "echo \"RANK=$RANK\nLOCAL_RANK=$LOCAL_RANK\nWORLD_SIZE=$WORLD_SIZE\nGROUP_RANK=$GROUP_RANK\n"
         "GROUP_WORLD_SIZE=$GROUP_WORLD_SIZE\nMASTER_PORT=$MASTER_PORT\" > env_$RANK.txt\n");
  int port = free_port();
  std::string args = "--nnodes 2 --nproc-per-node 2 --rdzv-endpoint 127.0.0.1:" + std::to_string(port) +
                     " --rdzv-id two -- sh env.sh";
  Result r = run_sh(dir_.path(), "\"$INGOT\" launch " + args + " > a.log 2>&1 & A=$!; \"$INGOT\" launch " + args +
                                     " > b.log 2>&1; echo b_exit=$?; wait $A; echo a_exit=$?");
  std::string logs = slurp(path("a.log")) + "\n----\n" + slurp(path("b.log"));
  EXPECT_NE(r.output.find("b_exit=0"), std::string::npos) << r.output << logs;
  EXPECT_NE(r.output.find("a_exit=0"), std::string::npos) << r.output << logs;
  std::set<std::string> groups;
  for (int rank = 0; rank < 4; ++rank) {
    auto v = read_vars(path("env_" + std::to_string(rank) + ".txt"));
    EXPECT_EQ(v["RANK"], std::to_string(rank)) << logs;
    EXPECT_EQ(v["WORLD_SIZE"], "4");
    EXPECT_EQ(v["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(v["LOCAL_RANK"], std::to_string(rank % 2));
    EXPECT_EQ(v["GROUP_RANK"], std::to_string(rank / 2));
    EXPECT_EQ(v["MASTER_PORT"], std::to_string(port));
  }
  EXPECT_NE(logs.find("(hosted here)"), std::string::npos) << logs;
}

TEST_F(Launch, AFailureOnOneNodeRestartsBothNodes) {
  script("w.sh",
         "if [ \"$INGOT_RESTART_COUNT\" = 0 ]; then\n"
         "  if [ \"$RANK\" = 3 ]; then sleep 0.2; exit 7; fi\n"
         "  exec sleep 30\n"
         "fi\n"
         "echo ok > done_$RANK\n");
  int port = free_port();
  std::string args = "--nnodes 2 --nproc-per-node 2 --max-restarts 1 --rdzv-endpoint 127.0.0.1:" +
                     std::to_string(port) + " -- sh w.sh";
  Result r = run_sh(dir_.path(), "\"$INGOT\" launch " + args + " > a.log 2>&1 & A=$!; \"$INGOT\" launch " + args +
                                     " > b.log 2>&1; echo b_exit=$?; wait $A; echo a_exit=$?");
  std::string logs = slurp(path("a.log")) + "\n----\n" + slurp(path("b.log"));
  EXPECT_NE(r.output.find("b_exit=0"), std::string::npos) << r.output << logs;
  EXPECT_NE(r.output.find("a_exit=0"), std::string::npos) << r.output << logs;
  EXPECT_LT(r.seconds, 5) << logs;
  EXPECT_NE(logs.find("exited with code 7"), std::string::npos) << logs;
  EXPECT_NE(logs.find("a worker on another node failed: rank 3"), std::string::npos) << logs;
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(slurp(path("done_" + std::to_string(rank))), "ok\n") << logs;
}

TEST_F(Launch, StaticNodeRanksWithAMasterPortFormOneWorld) {
  script("env.sh", "echo \"$GROUP_RANK $WORLD_SIZE\" > env_$RANK.txt\n");
  std::string common = "--nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port " +
                       std::to_string(free_port()) + " --rdzv-id st";
  Result r = run_sh(dir_.path(), "\"$INGOT\" launch " + common + " --node-rank 1 -- sh env.sh > b.log 2>&1 & B=$!; "
                                 "\"$INGOT\" launch " + common + " --node-rank 0 -- sh env.sh > a.log 2>&1; "
                                 "echo a_exit=$?; wait $B; echo b_exit=$?");
  std::string logs = slurp(path("a.log")) + "\n----\n" + slurp(path("b.log"));
  EXPECT_NE(r.output.find("a_exit=0"), std::string::npos) << r.output << logs;
  EXPECT_NE(r.output.find("b_exit=0"), std::string::npos) << r.output << logs;
  EXPECT_EQ(slurp(path("env_0.txt")), "0 2\n") << logs;  // node rank 0 has rank 0, as given
  EXPECT_EQ(slurp(path("env_1.txt")), "1 2\n") << logs;
}

TEST_F(Launch, TwoLaunchersClaimingTheSameNodeRankFailWithAClearError) {
  // Nodes 0 and 1 start a job; a second "node 1" is refused, and its error ends the job on the others too.
  std::string common = "--nnodes 2 --master-port " + std::to_string(free_port()) + " --rdzv-conf join_timeout=3";
  Result r = run_sh(dir_.path(),
                    "\"$INGOT\" launch " + common + " --node-rank 0 -- sleep 10 > a.log 2>&1 & A=$!; "
                    "\"$INGOT\" launch " + common + " --node-rank 1 -- sleep 10 > b.log 2>&1 & B=$!; sleep 0.3; "
                    "\"$INGOT\" launch " + common + " --node-rank 1 -- sleep 10 > c.log 2>&1; echo c_exit=$?; "
                    "wait $A; echo a_exit=$?; wait $B; echo b_exit=$?");
  std::string logs = slurp(path("a.log")) + "\n----\n" + slurp(path("b.log")) + "\n----\n" + slurp(path("c.log"));
  EXPECT_NE(r.output.find("c_exit=1"), std::string::npos) << r.output << logs;
  EXPECT_NE(r.output.find("a_exit=1"), std::string::npos) << r.output << logs;
  EXPECT_NE(r.output.find("b_exit=1"), std::string::npos) << r.output << logs;
  EXPECT_NE(slurp(path("c.log")).find("--node-rank 1 was already taken by another launcher"), std::string::npos)
      << logs;
  EXPECT_LT(r.seconds, 5) << "the running nodes should stop at once, not when their workers end\n" << logs;
}

TEST_F(Launch, NodeZeroThatCannotHostTheStoreSaysWhy) {
  TcpStoreServer taken(0, "0.0.0.0");
  Result r = launch("--nnodes 2 --master-port " + std::to_string(taken.port()) + " -- true");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("node rank 0 hosts the rendezvous store on --master-port " + std::to_string(taken.port()) +
                          " but cannot"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("ingot launch: error: node rank 0 hosts"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("error: ingot launch:"), std::string::npos) << "the prefix is printed twice:\n" << r.output;
}

TEST_F(Launch, AConfigErrorExitCodeTwoIsNotRestarted) {
  script("w.sh", "echo attempt $INGOT_RESTART_COUNT >> attempts_$RANK\nif [ \"$RANK\" = 1 ]; then exit 2; fi\n"
                 "exec sleep 30\n");
  Result r = launch("--nproc-per-node 2 --max-restarts 3 -- sh w.sh");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(slurp(path("attempts_1")), "attempt 0\n") << r.output;
  EXPECT_NE(r.output.find("giving up: the root cause exited with code 2 (a usage or config error, which fails the "
                          "same way on every restart), so the group is not restarted; root cause: rank 1"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("restarting the worker group"), std::string::npos) << r.output;
}

TEST_F(Launch, AFailedJobKeepsTheErrorFileItsReportPointsAtAndASuccessfulOneCleansUp) {
  script("w.sh", "printf '{\"message\": \"boom\", \"type\": \"error\"}' > \"$INGOT_ERROR_FILE\"; exit 3\n");
  Result r = run_sh(dir_.path(), "TMPDIR='" + dir_.path() + "' \"$INGOT\" launch -- sh w.sh");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string marker = "error file ";
  size_t at = r.output.find(marker);
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string file = r.output.substr(at + marker.size(), r.output.find(' ', at + marker.size()) - at - marker.size());
  EXPECT_TRUE(fs::is_regular_file(file)) << file << " is named in the report but does not exist\n" << r.output;
  EXPECT_NE(slurp(file).find("boom"), std::string::npos);
  EXPECT_NE(r.output.find("worker logs and error files are kept in " + path("ingot_launch_")), std::string::npos)
      << r.output;

  fs::create_directory(path("ok"));
  r = run_sh(dir_.path(), "TMPDIR='" + path("ok") + "' \"$INGOT\" launch -- true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(removed if the job succeeds)"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::is_empty(path("ok"))) << r.output;
}

TEST_F(Launch, TimeoutFlagsReachTheWorkersAndBadValuesAreRefused) {
  script("env.sh", "echo \"$INGOT_COLLECTIVE_TIMEOUT_S $INGOT_INIT_TIMEOUT_S\" > t_$RANK.txt\n");
  Result r = launch("--collective-timeout 42 --init-timeout 7.5 -- sh env.sh");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(slurp(path("t_0.txt")), "42 7.5\n");
  r = launch("--collective-timeout 0 -- true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--collective-timeout: expected a number of seconds > 0, got '0'"), std::string::npos)
      << r.output;
}

TEST_F(Launch, ANodeRangeStartsWithTheNodesPresentAfterTheLastCall) {
  script("env.sh", "echo \"$WORLD_SIZE $GROUP_WORLD_SIZE\" > env_$RANK.txt\n");
  Result r = launch("--nnodes 1:2 --nproc-per-node 2 --rdzv-endpoint 127.0.0.1:" + std::to_string(free_port()) +
                    " --rdzv-conf last_call_timeout=0.2 -- sh env.sh");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(slurp(path("env_0.txt")), "2 1\n") << r.output;
  EXPECT_EQ(slurp(path("env_1.txt")), "2 1\n") << r.output;
}

TEST_F(Launch, BadCommandLinesExitTwoWithAPointerToHelp) {
  Result r = launch("--nproc-per-node zero -- true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ingot launch: --nproc-per-node: expected a positive number, gpu, cpu or auto, got 'zero'"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("Try 'ingot launch --help'."), std::string::npos) << r.output;
  r = launch("--nproc-per-node 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("missing the worker command"), std::string::npos) << r.output;
  r = launch("-- no-such-program-ingot-test");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("worker command 'no-such-program-ingot-test' was not found in PATH"), std::string::npos)
      << r.output;
}

TEST_F(Launch, UnknownFlagsAndBadValuesExitTwoNamingTheFlag) {
  Result r = launch("--nproc-per-nod 2 -- true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ingot launch: unknown option '--nproc-per-nod' (did you mean --nproc-per-node?)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("Try 'ingot launch --help'."), std::string::npos) << r.output;
  r = launch("--frobnicate=3 -- true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown option '--frobnicate=3'"), std::string::npos) << r.output;
  for (const char* spelling : {"--max-restarts", "--max_restarts"}) {
    r = launch(std::string(spelling) + " many -- true");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("ingot launch: --max-restarts: expected a count >= 0, got 'many'"), std::string::npos)
        << r.output;
  }
  r = launch("--monitor_interval=-1 -- true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--monitor-interval: expected a number of seconds > 0, got '-1'"), std::string::npos)
      << r.output;
  r = launch("--log-dir");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ingot launch: --log-dir needs a value"), std::string::npos) << r.output;
}

TEST_F(Launch, TorchrunUnderscoreSpellingsRunTheSameJob) {
  script("env.sh", "echo \"$WORLD_SIZE $LOCAL_WORLD_SIZE $INGOT_MAX_RESTARTS $*\" > env_$RANK.txt\n");
  for (const char* flags : {"--nproc-per-node 2 --max-restarts 1", "--nproc_per_node=2 --max_restarts 1"}) {
    Result r = launch(std::string(flags) + " sh env.sh --nproc_per_node 5 -- x");
    ASSERT_EQ(r.exit_code, 0) << flags << ": " << r.output;
    EXPECT_EQ(slurp(path("env_0.txt")), "2 2 1 --nproc_per_node 5 -- x\n") << flags;
    EXPECT_EQ(slurp(path("env_1.txt")), "2 2 1 --nproc_per_node 5 -- x\n") << flags;
    fs::remove(path("env_0.txt"));
    fs::remove(path("env_1.txt"));
  }
}

TEST_F(Launch, HelpListsEveryFlag) {
  Result r = launch("--help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* flag : {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                           "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--max-restarts", "--monitor-interval",
                           "--standalone", "--log-dir", "--redirects", "--tee", "--local-addr", "--stop-timeout",
                           "--collective-timeout", "--init-timeout",
                           "INGOT_RESTART_COUNT", "INGOT_ERROR_FILE", "Exit status"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
  EXPECT_NE(run_sh(dir_.path(), "\"$INGOT\" --help").output.find("ingot launch"), std::string::npos);
}

TEST_F(Launch, IngotRunWorkerWritesItsUncaughtErrorToTheErrorFile) {
  // `ingot` as the command is the launcher's own binary; its failure reaches the report through the error file.
  std::ofstream(path("bad.yaml")) << "recipe: pretrain\nmax_stepz: 3\n";
  Result r = launch("--nproc-per-node 2 --log-dir logs -- ingot run bad.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("root cause (first worker to fail): rank "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(config error):"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("max_stepz"), std::string::npos) << r.output;
  // Both ranks fail alike; whichever fails first gets the other stopped, possibly before it wrote its file.
  const std::string files = slurp(path("logs/attempt_0/rank_0/error.json")) + slurp(path("logs/attempt_0/rank_1/error.json"));
  EXPECT_NE(files.find("max_stepz"), std::string::npos) << files;
}

TEST_F(Launch, GpuWorkersArePinnedToOneGpuEach) {
  int gpus = cuda_device_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device; this test runs on the lent GPU machine";
  script("w.sh", "echo \"$CUDA_VISIBLE_DEVICES\" > gpu_$LOCAL_RANK\n");
  Result r = launch("--nproc-per-node gpu -- sh w.sh");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int i = 0; i < gpus; ++i) EXPECT_FALSE(slurp(path("gpu_" + std::to_string(i))).empty()) << i;
  if (!getenv("CUDA_VISIBLE_DEVICES")) {
    for (int i = 0; i < gpus; ++i) EXPECT_EQ(slurp(path("gpu_" + std::to_string(i))), std::to_string(i) + "\n");
  }
}

TEST_F(Launch, StandaloneRunsOnAFreeLocalPort) {
  script("w.sh", "echo \"$MASTER_ADDR:$MASTER_PORT\" > addr_$RANK\n");
  Result r = launch("--standalone --nproc-per-node 2 -- sh w.sh");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string a = slurp(path("addr_0"));
  EXPECT_EQ(a, slurp(path("addr_1")));
  EXPECT_EQ(a.rfind("127.0.0.1:", 0), 0u) << a;
}

}  // namespace
}  // namespace ingot::distributed::launch
