// Running a shell command line from a test, as a user would run the `ingot` binary or the launcher: what it
// printed on stdout (and stderr where the command line folds it in with 2>&1), its exit status, how long it took.
#pragma once

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>

namespace ingot::testing {

struct ShellResult {
  int exit_code = -1;  // -1: not started, or ended by a signal
  std::string output;
  double seconds = 0;
};

inline ShellResult run_shell(const std::string& command_line) {
  const auto t0 = std::chrono::steady_clock::now();
  ShellResult r;
  FILE* p = popen(command_line.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace ingot::testing
