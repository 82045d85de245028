// Running the system C++ compiler on generated sources: which compiler and flags (Toolchain), and building
// several translation units into shared objects at once, one compiler process per unit.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace ingot::codegen::cpu {

struct Toolchain {
  std::string compiler;            // $INGOT_CXX, else $CXX, else "c++"
  std::vector<std::string> flags;  // -O3 -march=native -fopenmp ... -shared -fPIC (see jit_cc.cpp)
  // Everything that changes the machine code for a given source: compiler version, flags and the host CPU
  // (-march=native). Part of every kernel cache key, so a cache shared by two machines never hands one
  // the other's instructions.
  std::string identity;

  // The toolchain of this host, detected once per process (runs `<compiler> --version`).
  static const Toolchain& host();
};

struct CompileJob {
  std::string source;  // a .cpp file
  std::string output;  // the .so to build
  std::string log;     // where the compiler's stdout/stderr go
};

// Builds every job, running up to `max_parallel` compilers at a time; `on_done(j)`, when given, is called as
// job j finishes (in completion order). Throws ingot::Error naming the first failing source and quoting its
// diagnostics (the source is left in place for reading).
void run_compilers(const Toolchain& tc, const std::vector<CompileJob>& jobs, int max_parallel,
                   const std::function<void(size_t)>& on_done = {});

}  // namespace ingot::codegen::cpu
