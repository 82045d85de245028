// CPU code generation end to end: KernelSpecs in, callable functions out.
//
// For a batch of specs: drop the ones already compiled in this process (same structural key), then look the
// rest up in the on-disk compile cache (a hit loads the cached .so: no source, no compiler), then render the
// remaining distinct kernels into at most `max_parallel` translation units, build them with that many
// compiler processes side by side, store each .so and one entry per kernel in the cache, and dlopen them.
// Processes that miss the same batch at once (the ranks of a job) take a lock in the cache directory: one
// compiles, the others then load its results.
//
// Calling a kernel: see the C ABI in compile/codegen/common/kernel_spec.h.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "compile/codegen/common/codegen_stats.h"
#include "compile/codegen/common/kernel_spec.h"

namespace ingot::codegen::cpu {

using KernelFn = void (*)(void* const* bufs, const int64_t* syms, const double* scalars);
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

struct CpuKernel {
  KernelFn fn = nullptr;
  std::string symbol;
  std::shared_ptr<void> library;  // keeps the shared object loaded while the kernel is in use

  void operator()(void* const* bufs, const int64_t* syms, const double* scalars) const { fn(bufs, syms, scalars); }
};

struct CpuCodegenOptions {
  std::string cache_dir;        // "" = cache::CompileCache::default_dir()
  bool use_disk_cache = true;   // false: build in a temporary directory and persist nothing
  int max_parallel = 0;         // compiler processes at once; 0 = the number of hardware threads
};

class CpuCodegen {
 public:
  explicit CpuCodegen(CpuCodegenOptions options = {});

  // Compiled kernels for `specs`, in order. Identical kernels are compiled once: within the batch, across
  // calls on this object and, through the disk cache, across processes. `stats`, when given, receives this
  // call's counts and phase times (added to what it holds). Throws ingot::Error for an invalid spec (naming
  // it) or a compiler failure (quoting the diagnostics).
  // `progress(done, total)`, when given, is called after the lookups and as each compiler run finishes
  // (done counts distinct kernels ready, total the distinct kernels of the batch).
  std::vector<CpuKernel> compile(const std::vector<KernelSpec>& specs, CodegenStats* stats = nullptr,
                                 const ProgressFn& progress = {});
  CpuKernel compile(const KernelSpec& spec, CodegenStats* stats = nullptr);

  CodegenStats stats() const;  // totals since construction
  const CpuCodegenOptions& options() const { return options_; }

  // One instance per process with the default options: kernels are shared by every graph compiled here.
  static CpuCodegen& shared();

 private:
  CpuCodegenOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, CpuKernel> table_;  // structural key -> loaded kernel
  CodegenStats totals_;
};

}  // namespace ingot::codegen::cpu
