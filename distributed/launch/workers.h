// The local worker processes of one attempt: started with fork/exec, each in its own process group (so
// stopping a worker also stops what it started), their output routed to the console and/or log files, and
// reaped without blocking so the launcher can watch its store and its signals at the same time.
#pragma once

#include <sys/types.h>

#include <deque>
#include <string>
#include <vector>

namespace ingot::distributed::launch {

// SIGINT, SIGTERM, SIGHUP and SIGCHLD turned into bytes on a self-pipe, so one poll() watches worker output,
// worker exits and the user's Ctrl-C. One instance at a time (it owns the process's handlers while alive).
class SignalWatch {
 public:
  SignalWatch();
  ~SignalWatch();  // restores the previous handlers
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;
  int fd() const { return pipe_[0]; }
  // Reads what is pending; returns the number of stop requests (SIGINT/SIGTERM/SIGHUP) seen so far.
  int consume();
  int stop_requests() const { return stop_requests_; }
  int first_stop_signal() const { return first_stop_signal_; }  // 0 until one arrived

 private:
  int pipe_[2] = {-1, -1};
  int stop_requests_ = 0, first_stop_signal_ = 0;
};

struct WorkerSpec {
  int local_rank = 0;
  int rank = 0;
  std::vector<std::string> env;  // the full environment, "KEY=value"
  // Per stream (stdout, stderr): written to `*_path` only (redirect), to the path and to the console with a
  // "[rank]:" prefix (tee), or to the console unchanged (neither). Paths are needed for redirect and tee.
  bool redirect_stdout = false, redirect_stderr = false, tee_stdout = false, tee_stderr = false;
  std::string stdout_path, stderr_path, error_file;
};

struct WorkerStatus {
  pid_t pid = -1;
  bool running = false;
  bool exited = false;        // reaped
  int exit_code = 0;          // when it exited normally
  int signal = 0;             // when a signal ended it
  bool stopped_by_us = false; // ended after we sent a stop signal
  double end_time = 0;        // seconds since the group started, when reaped
  double end_wall = 0;        // the same moment in seconds since the epoch (comparable to error files)
  bool failed() const { return exited && (signal != 0 || exit_code != 0); }
  std::string describe() const;  // "exited with code 3", "was killed by SIGKILL (signal 9)"
};

class WorkerGroup {
 public:
  WorkerGroup(std::vector<std::string> command, std::vector<WorkerSpec> specs);
  ~WorkerGroup();  // kills (SIGKILL) and reaps any worker still running
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts every worker. Throws (after stopping those already started) if one cannot be started.
  void start();
  // Forwards output and reaps exited workers, waiting up to `timeout_s` for output, a worker exit or a stop
  // signal. Returns early when something happened.
  void poll(double timeout_s, SignalWatch& signals);
  // Sends `sig` to every running worker's process group, waits up to `grace_s` for them to exit (forwarding
  // output; a further stop signal to the launcher cuts the wait short), then SIGKILLs the rest and reaps all.
  void stop(int sig, double grace_s, SignalWatch& signals);

  size_t size() const { return specs_.size(); }
  const WorkerSpec& spec(size_t i) const { return specs_[i]; }
  const WorkerStatus& status(size_t i) const { return status_[i]; }
  bool all_exited() const;
  bool any_failed() const;
  // The last lines a worker wrote (stderr and stdout, in the order read), up to `max_lines`.
  std::vector<std::string> last_lines(size_t i, size_t max_lines) const;

 private:
  struct Stream;
  void drain(Stream& s);
  void add_line(size_t worker, std::string line);
  void reap();
  double now() const;

  std::vector<std::string> command_;
  std::vector<WorkerSpec> specs_;
  std::vector<WorkerStatus> status_;
  std::vector<Stream*> streams_;  // owned; one per piped stream
  std::vector<std::deque<std::string>> tails_;
  double start_time_ = 0;
};

// "SIGKILL" for 9 (the name `kill -l` prints).
std::string signal_name(int sig);

// The executable for a command name: a path is taken as is, "ingot" is this very program (/proc/self/exe,
// so the workers run the launcher's own version), anything else is searched in PATH. Throws if not found.
std::string find_program(const std::string& name);

}  // namespace ingot::distributed::launch
