// With INGOT_CRASH_BACKTRACE=1, a crash of the test binary prints the raw stack and the executable's load
// address before dying, so a crash on the GPU machine (no debugger there) can be symbolized here with
// `addr2line -e build/bin/ingot_tests -f -C <pc - base>`.
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace {

void on_crash(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&on_crash), &self);
  char head[128];
  const int len = std::snprintf(head, sizeof head, "fatal signal %d; executable base %p; stack:\n", sig, self.dli_fbase);
  if (len > 0) (void)!write(STDERR_FILENO, head, static_cast<size_t>(len));
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

const bool installed = [] {
  const char* v = std::getenv("INGOT_CRASH_BACKTRACE");
  if (v == nullptr || v[0] != '1') return false;
  signal(SIGSEGV, on_crash);
  signal(SIGBUS, on_crash);
  signal(SIGABRT, on_crash);
  return true;
}();

}  // namespace
