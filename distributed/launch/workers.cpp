#include "distributed/launch/workers.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "runtime/error.h"
#include "runtime/file_util.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

namespace ingot::distributed::launch {

namespace {

constexpr size_t kTailLines = 40;
int g_signal_pipe = -1;
const int kWatched[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
struct sigaction g_previous[4];

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (g_signal_pipe >= 0) (void)!write(g_signal_pipe, &b, 1);
  errno = saved;
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // a closed console must not stop the launcher from supervising its workers
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

// --- signals ---

SignalWatch::SignalWatch() {
  INGOT_CHECK(g_signal_pipe < 0, "only one SignalWatch may be active at a time");
  INGOT_CHECK(pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) == 0, "pipe2 failed: ", strerror(errno));
  g_signal_pipe = pipe_[1];
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < 4; ++i) sigaction(kWatched[i], &sa, &g_previous[i]);
}

SignalWatch::~SignalWatch() {
  for (int i = 0; i < 4; ++i) sigaction(kWatched[i], &g_previous[i], nullptr);
  g_signal_pipe = -1;
  close(pipe_[0]);
  close(pipe_[1]);
}

int SignalWatch::consume() {
  unsigned char buf[64];
  ssize_t n;
  while ((n = read(pipe_[0], buf, sizeof(buf))) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] == SIGCHLD) continue;
      if (first_stop_signal_ == 0) first_stop_signal_ = buf[i];
      ++stop_requests_;
    }
  }
  return stop_requests_;
}

// --- helpers ---

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    default: return "signal " + std::to_string(sig);
  }
}

std::string WorkerStatus::describe() const {
  if (!exited) return running ? "is running" : "was not started";
  if (signal != 0) {
    return "was killed by " + signal_name(signal) + " (signal " + std::to_string(signal) + ")";
  }
  return "exited with code " + std::to_string(exit_code);
}

std::string find_program(const std::string& name) {
  namespace fs = std::filesystem;
  INGOT_CHECK(!name.empty(), "the worker command is empty");
  if (name.find('/') != std::string::npos) {
    INGOT_CHECK(access(name.c_str(), X_OK) == 0 && !fs::is_directory(name),
                "worker command '", name, "' is not an executable file");
    return name;
  }
  if (name == "ingot") return fs::read_symlink("/proc/self/exe").string();
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t colon = p.find(':', start);
    std::string dir = p.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    std::string cand = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (access(cand.c_str(), X_OK) == 0 && !fs::is_directory(cand)) return cand;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  INGOT_FAIL("worker command '", name, "' was not found in PATH");
}

// --- workers ---

struct WorkerGroup::Stream {
  int fd = -1;        // read end of the pipe
  size_t worker = 0;
  int console = -1;   // 1 or 2: the launcher's stream it is copied to
  int file = -1;      // log file (tee), or -1
  std::string prefix; // "[rank]:" when teed
  std::string partial;  // bytes after the last newline
};

WorkerGroup::WorkerGroup(std::vector<std::string> command, std::vector<WorkerSpec> specs)
    : command_(std::move(command)), specs_(std::move(specs)), status_(specs_.size()), tails_(specs_.size()) {}

WorkerGroup::~WorkerGroup() {
  for (size_t i = 0; i < status_.size(); ++i) {
    if (status_[i].running) {
      kill(-status_[i].pid, SIGKILL);
      int st;
      waitpid(status_[i].pid, &st, 0);
    }
  }
  for (Stream* s : streams_) {
    if (s->fd >= 0) close(s->fd);
    if (s->file >= 0) close(s->file);
    delete s;
  }
}

double WorkerGroup::now() const { return seconds_now() - start_time_; }

void WorkerGroup::start() {
  start_time_ = seconds_now();
  std::string program = find_program(command_.at(0));
  std::vector<char*> argv;
  for (std::string& a : command_) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();

  for (size_t i = 0; i < specs_.size(); ++i) {
    WorkerSpec& w = specs_[i];
    std::vector<char*> envp;
    for (std::string& e : w.env) envp.push_back(e.data());
    envp.push_back(nullptr);

    // Each stream becomes: the launcher's own fd (console, stdout only), a log file, or a pipe we read.
    int child_fd[2] = {-1, -1};  // what the child dup2s onto 1 and 2; -1 = inherit
    auto open_log = [&](const std::string& path) {
      int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      INGOT_CHECK(fd >= 0, "cannot open log file '", path, "': ", strerror(errno));
      return fd;
    };
    int to_close[4] = {-1, -1, -1, -1};
    for (int k = 0; k < 2; ++k) {
      bool tee = k == 0 ? w.tee_stdout : w.tee_stderr;
      bool redirect = k == 0 ? w.redirect_stdout : w.redirect_stderr;
      const std::string& path = k == 0 ? w.stdout_path : w.stderr_path;
      if (redirect && !tee) {
        child_fd[k] = to_close[k] = open_log(path);
        continue;
      }
      // stdout to the console is inherited (keeps the worker's own buffering); stderr is piped even then so
      // its last lines can be shown when the worker fails.
      if (!tee && k == 0) continue;
      int p[2];
      INGOT_CHECK(pipe2(p, O_CLOEXEC) == 0, "pipe2 failed: ", strerror(errno));
      fcntl(p[0], F_SETFL, O_NONBLOCK);
      auto* s = new Stream;
      s->fd = p[0];
      s->worker = i;
      s->console = k + 1;
      if (tee) {
        s->file = open_log(path);
        s->prefix = "[" + std::to_string(w.rank) + "]:";
      }
      streams_.push_back(s);
      child_fd[k] = to_close[k] = p[1];
    }
    int status_pipe[2];
    INGOT_CHECK(pipe2(status_pipe, O_CLOEXEC) == 0, "pipe2 failed: ", strerror(errno));

    pid_t pid = fork();
    INGOT_CHECK(pid >= 0, "fork failed: ", strerror(errno));
    if (pid == 0) {
      // Child: only async-signal-safe calls from here to exec (the launcher may run other threads).
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // the launcher died without stopping us
      if (getppid() != parent) _exit(128 + SIGTERM);
      struct sigaction dfl = {};
      dfl.sa_handler = SIG_DFL;
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE, SIGQUIT}) sigaction(sig, &dfl, nullptr);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int k = 0; k < 2; ++k)
        if (child_fd[k] >= 0) dup2(child_fd[k], k + 1);
      // Nothing else of the launcher's (store sockets, other workers' pipes) may leak into the worker.
      syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
      execve(program.c_str(), argv.data(), envp.data());
      int err = errno;
      (void)!write(status_pipe[1], &err, sizeof(err));
      _exit(127);
    }
    setpgid(pid, pid);  // also here, so a stop right after fork reaches the group
    close(status_pipe[1]);
    for (int fd : to_close)
      if (fd >= 0) close(fd);
    status_[i].pid = pid;
    status_[i].running = true;
    int err = 0;
    ssize_t n;
    do n = read(status_pipe[0], &err, sizeof(err));
    while (n < 0 && errno == EINTR);
    close(status_pipe[0]);
    if (n == sizeof(err)) {
      int st;
      waitpid(pid, &st, 0);
      status_[i].running = false;
      for (size_t j = 0; j < i; ++j) {
        kill(-status_[j].pid, SIGKILL);
        waitpid(status_[j].pid, &st, 0);
        status_[j].running = false;
      }
      INGOT_FAIL("cannot execute '", program, "': ", strerror(err));
    }
  }
}

void WorkerGroup::add_line(size_t worker, std::string line) {
  auto& tail = tails_[worker];
  tail.push_back(std::move(line));
  if (tail.size() > kTailLines) tail.pop_front();
}

void WorkerGroup::drain(Stream& s) {
  char buf[65536];
  while (s.fd >= 0) {
    ssize_t n = read(s.fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // nothing more for now
    if (n <= 0) {  // end of stream: every writer (the worker and anything it started) is gone
      close(s.fd);
      s.fd = -1;
      if (!s.partial.empty()) {
        std::string line = std::move(s.partial);
        s.partial.clear();
        if (s.file >= 0) write_all(s.file, line.data(), line.size());
        if (!s.prefix.empty()) {
          std::string out = s.prefix + line + "\n";
          write_all(s.console, out.data(), out.size());
        }
        add_line(s.worker, std::move(line));
      }
      return;
    }
    size_t len = static_cast<size_t>(n);
    if (s.file >= 0) write_all(s.file, buf, len);
    if (s.prefix.empty()) write_all(s.console, buf, len);  // unprefixed: pass bytes through as they come
    s.partial.append(buf, len);
    size_t start = 0, nl;
    std::string prefixed;
    while ((nl = s.partial.find('\n', start)) != std::string::npos) {
      std::string line = s.partial.substr(start, nl - start);
      if (!s.prefix.empty()) prefixed += s.prefix + line + "\n";
      add_line(s.worker, std::move(line));
      start = nl + 1;
    }
    s.partial.erase(0, start);
    if (!prefixed.empty()) write_all(s.console, prefixed.data(), prefixed.size());
  }
}

void WorkerGroup::reap() {
  for (WorkerStatus& w : status_) {
    if (!w.running) continue;
    int st = 0;
    pid_t r = waitpid(w.pid, &st, WNOHANG);
    if (r != w.pid) continue;
    w.running = false;
    w.exited = true;
    w.end_time = now();
    w.end_wall = wall_now();
    if (WIFSIGNALED(st)) w.signal = WTERMSIG(st);
    else w.exit_code = WEXITSTATUS(st);
  }
}

void WorkerGroup::poll(double timeout_s, SignalWatch& signals) {
  std::vector<pollfd> fds;
  fds.push_back({signals.fd(), POLLIN, 0});
  std::vector<Stream*> polled;
  for (Stream* s : streams_)
    if (s->fd >= 0) {
      fds.push_back({s->fd, POLLIN, 0});
      polled.push_back(s);
    }
  int ms = static_cast<int>(timeout_s * 1000);
  int r = ::poll(fds.data(), fds.size(), ms);
  if (r > 0) {
    if (fds[0].revents) signals.consume();
    for (size_t k = 1; k < fds.size(); ++k)
      if (fds[k].revents) drain(*polled[k - 1]);
  }
  reap();
  // A worker that exited has written all it will write: show it before anyone reports on the exit.
  for (Stream* s : streams_)
    if (s->fd >= 0 && !status_[s->worker].running) drain(*s);
}

void WorkerGroup::stop(int sig, double grace_s, SignalWatch& signals) {
  std::vector<size_t> stopping;
  for (size_t i = 0; i < status_.size(); ++i) {
    if (!status_[i].running) continue;
    status_[i].stopped_by_us = true;
    kill(-status_[i].pid, sig);
    stopping.push_back(i);
  }
  int requests = signals.stop_requests();
  double deadline = seconds_now() + grace_s;
  while (!all_exited() && seconds_now() < deadline && signals.stop_requests() == requests)
    poll(std::min(0.05, std::max(0.0, deadline - seconds_now())), signals);
  for (size_t i : stopping) {
    kill(-status_[i].pid, SIGKILL);  // the leader if still there, and anything it started
    if (status_[i].running) {
      int st;
      waitpid(status_[i].pid, &st, 0);
      status_[i].running = false;
      status_[i].exited = true;
      status_[i].end_time = now();
      status_[i].end_wall = wall_now();
      if (WIFSIGNALED(st)) status_[i].signal = WTERMSIG(st);
      else status_[i].exit_code = WEXITSTATUS(st);
    }
  }
  for (Stream* s : streams_) drain(*s);
}

bool WorkerGroup::all_exited() const {
  for (const WorkerStatus& w : status_)
    if (w.running) return false;
  return true;
}

bool WorkerGroup::any_failed() const {
  for (const WorkerStatus& w : status_)
    if (w.failed()) return true;
  return false;
}

std::vector<std::string> WorkerGroup::last_lines(size_t i, size_t max_lines) const {
  std::deque<std::string> from_file;
  const WorkerSpec& w = specs_.at(i);
  if (w.redirect_stderr && !w.tee_stderr) {
    // stderr went straight to its file; read the file's end.
    std::string text;
    try {
      text = read_file(w.stderr_path);
    } catch (const std::exception&) {
    }
    if (text.size() > 65536) text.erase(0, text.size() - 65536);
    size_t start = 0, nl;
    while ((nl = text.find('\n', start)) != std::string::npos) {
      from_file.push_back(text.substr(start, nl - start));
      start = nl + 1;
    }
    if (start < text.size()) from_file.push_back(text.substr(start));
  }
  const auto& t = from_file.empty() ? tails_.at(i) : from_file;
  size_t from = t.size() > max_lines ? t.size() - max_lines : 0;
  return {t.begin() + static_cast<std::ptrdiff_t>(from), t.end()};
}

}  // namespace ingot::distributed::launch
