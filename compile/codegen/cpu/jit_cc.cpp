// System compiler invocation for generated kernels (see jit_cc.h).
#include "compile/codegen/cpu/jit_cc.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"

extern char** environ;

namespace ingot::codegen::cpu {

namespace {

// First line of `cmd`'s output, or "" when it cannot run.
std::string first_line_of(const std::string& cmd) {
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "";
  char buf[512] = {0};
  const bool got = std::fgets(buf, sizeof buf, p) != nullptr;
  ::pclose(p);
  std::string s = got ? buf : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

// The host CPU as /proc/cpuinfo describes it (model and feature flags of the first core).
std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(in, line) && (model.empty() || flags.empty())) {
    if (model.empty() && line.rfind("model name", 0) == 0) model = line;
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
  }
  return model + "|" + flags;
}

bool has_libmvec() {
  for (const char* p : {"/usr/lib/x86_64-linux-gnu/libmvec.so", "/lib/x86_64-linux-gnu/libmvec.so", "/usr/lib64/libmvec.so",
                        "/usr/lib/libmvec.so"})
    if (std::filesystem::exists(p)) return true;
  return false;
}

std::string tail_of_file(const std::string& path, size_t max_lines) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string l;
  while (std::getline(in, l)) lines.push_back(l);
  std::string out;
  const size_t from = lines.size() > max_lines ? lines.size() - max_lines : 0;
  for (size_t i = from; i < lines.size(); ++i) out += "  " + lines[i] + "\n";
  return out;
}

}  // namespace

const Toolchain& Toolchain::host() {
  static const Toolchain tc = [] {
    Toolchain t;
    const char* env = std::getenv("INGOT_CXX");
    if (!env || !*env) env = std::getenv("CXX");
    t.compiler = env && *env ? env : "c++";
    // No -ffast-math: it assumes no NaN/inf (masks use -inf) and, linked into a shared object by GCC < 13,
    // turns on flush-to-zero for the whole process. -fno-math-errno is what vectorizing math calls needs.
    // -ffp-contract=off: no a * b + c fused into one FMA (-march=native has them; the eager kernels, built for the
    // baseline x86-64, do not), so a generated kernel rounds each operation as the eager one does: an optimizer
    // update of bf16 weights keys its stochastic rounding on the f32 result's bits (Note [Stochastic rounding]).
    t.flags = {"-std=c++17", "-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fno-math-errno",
               "-fno-trapping-math", "-fPIC", "-shared", "-w"};
#if defined(__x86_64__)
    if (has_libmvec()) t.flags.insert(t.flags.end(), {"-DINGOT_JIT_MVEC", "-lmvec"});
#endif
    std::string id = first_line_of(t.compiler + " --version 2>/dev/null");
    INGOT_CHECK(!id.empty(), "[codegen] the C++ compiler '", t.compiler,
                "' does not run (`--version` failed); install g++ or clang++, or set INGOT_CXX");
    for (const std::string& f : t.flags) id += " " + f;
    t.identity = id + "\n" + cpu_description();
    return t;
  }();
  return tc;
}

void run_compilers(const Toolchain& tc, const std::vector<CompileJob>& jobs, int max_parallel,
                   const std::function<void(size_t)>& on_done) {
  max_parallel = std::max(1, max_parallel);
  struct Running {
    pid_t pid;
    size_t job;
  };
  std::vector<Running> running;
  std::string first_error;
  auto spawn = [&](size_t j) {
    const CompileJob& job = jobs[j];
    std::vector<std::string> args = {tc.compiler};
    args.insert(args.end(), tc.flags.begin(), tc.flags.end());
    // The libraries go after the source so that the linker sees them after their users.
    std::vector<std::string> libs;
    args.erase(std::remove_if(args.begin(), args.end(),
                              [&](const std::string& a) {
                                if (a.rfind("-l", 0) != 0) return false;
                                libs.push_back(a);
                                return true;
                              }),
               args.end());
    args.insert(args.end(), {job.source, "-o", job.output});
    args.insert(args.end(), libs.begin(), libs.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, job.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid = 0;
    const int rc = ::posix_spawnp(&pid, tc.compiler.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    INGOT_CHECK(rc == 0, "[codegen] cannot start the C++ compiler '", tc.compiler, "': ", std::strerror(rc),
                "; install g++ or clang++, or set INGOT_CXX");
    running.push_back({pid, j});
  };
  // Waits for whichever compiler finishes first (polling our own children only: waitpid(-1) could reap
  // processes that other parts of the program wait for).
  auto wait_one = [&] {
    int status = 0;
    size_t idx = 0;
    for (;;) {
      bool done = false;
      for (idx = 0; idx < running.size(); ++idx) {
        pid_t rc = ::waitpid(running[idx].pid, &status, WNOHANG);
        while (rc < 0 && errno == EINTR) rc = ::waitpid(running[idx].pid, &status, WNOHANG);
        if (rc == running[idx].pid || rc < 0) {
          done = true;
          break;
        }
      }
      if (done) break;
      ::usleep(2000);
    }
    const Running r = running[idx];
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(idx));
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok && on_done) on_done(r.job);
    if (!ok && first_error.empty()) {
      std::ostringstream os;
      os << "[codegen] the C++ compiler failed on generated source '" << jobs[r.job].source << "' ("
         << (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status)) : std::string("killed"))
         << "); the end of its output (" << jobs[r.job].log << "):\n"
         << tail_of_file(jobs[r.job].log, 30);
      first_error = os.str();
    }
  };
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (static_cast<int>(running.size()) >= max_parallel) wait_one();
    try {
      spawn(j);
    } catch (...) {
      while (!running.empty()) wait_one();
      throw;
    }
  }
  while (!running.empty()) wait_one();
  INGOT_CHECK(first_error.empty(), first_error);
}

}  // namespace ingot::codegen::cpu
