// What code generation cost and how much it reused, by phase: the compiler core adds these to its compile
// report (`explain`, the run summary, INGOT_LOGS=perf).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ingot::codegen {

struct CodegenStats {
  int64_t kernels_requested = 0;   // specs asked for, repeats included
  int64_t memory_hits = 0;         // already compiled in this process (same structural key)
  int64_t disk_hits = 0;           // loaded from the on-disk cache: no source emitted, no compiler run
  int64_t compiled = 0;            // distinct kernels built by the C++ compiler
  int64_t compiler_processes = 0;  // compiler invocations (one per translation unit)
  double emit_s = 0;               // validating, canonicalizing, hashing and rendering C++ source
  double compiler_s = 0;           // waiting for the C++ compiler processes
  double load_s = 0;               // cache lookups and writes, dlopen and dlsym

  double total_s() const { return emit_s + compiler_s + load_s; }

  CodegenStats& operator+=(const CodegenStats& o) {
    kernels_requested += o.kernels_requested;
    memory_hits += o.memory_hits;
    disk_hits += o.disk_hits;
    compiled += o.compiled;
    compiler_processes += o.compiler_processes;
    emit_s += o.emit_s;
    compiler_s += o.compiler_s;
    load_s += o.load_s;
    return *this;
  }

  // "kernels 12: 3 reused, 5 from disk cache, 4 compiled in 2 compiler runs; emit 0.010 s, compiler 1.920 s,
  // load 0.030 s"
  std::string summary() const {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "kernels %lld: %lld reused, %lld from disk cache, %lld compiled in %lld compiler runs; emit %.3f s, "
                  "compiler %.3f s, load %.3f s",
                  static_cast<long long>(kernels_requested), static_cast<long long>(memory_hits),
                  static_cast<long long>(disk_hits), static_cast<long long>(compiled),
                  static_cast<long long>(compiler_processes), emit_s, compiler_s, load_s);
    return buf;
  }
};

}  // namespace ingot::codegen
