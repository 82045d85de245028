// CUDA code generation end to end: KernelSpecs in, launchable kernels out. The same shape as
// codegen::cpu::CpuCodegen, so the compiler core picks a backend by the graph's device and otherwise treats
// both alike (a CudaKernel is called with the same C ABI as a CpuKernel: the buffer pointers are device
// pointers, syms and scalars stay on the host).
//
// For a batch of specs on the current device: drop the ones this process already loaded (same structural
// key, same device), look the rest up in the on-disk compile cache (a hit loads the cached cubin: no
// rendering, no NVRTC), render the remaining distinct kernels into at most `max_parallel` NVRTC programs
// (many kernels per program amortize NVRTC's fixed cost), compile them in parallel threads for the device's
// architecture, store each cubin and one entry per kernel in the cache (key: structural key + sm_XX + NVRTC
// version; the cache stamps the ingot version), and load them with the driver API.
//
// Selecting it in the compiler core (compile/pipeline.cpp), for a graph whose values all live on one CUDA
// device, under #ifdef INGOT_WITH_CUDA_CODEGEN (defined by codegen/cuda/cuda.cmake):
//     codegen::cuda::CudaCodegen::shared()            (or one instance per cache_dir, as for the CPU)
//         .compile(specs, &codegen_stats, progress)   -> std::vector<CudaKernel>, same order as specs
//     kernel(bufs, syms, scalars)                     the C ABI of kernel_spec.h; device buffer pointers
// and codegen::cuda::render_kernel(spec, kernel.symbol).source for INGOT_LOGS=output_code. The executor's
// kernel steps can call a CudaKernel exactly where they call a CpuKernel (output tensors allocated on the
// graph's device); MultiTensor steps must keep syms/scalars on the host.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "compile/codegen/common/codegen_stats.h"
#include "compile/codegen/cuda/render_cuda.h"
#include "compile/codegen/common/kernel_spec.h"

namespace ingot::codegen::cuda {

struct LoadedKernel;  // the module, its functions and the multi-tensor tables (cuda_codegen.cpp)

class CudaKernel {
 public:
  // Launches on ingot's current stream of the kernel's device (runtime/cuda_runtime.h) with `config`
  // (the codegen's default launch config). Asynchronous, like every eager CUDA kernel.
  void operator()(void* const* bufs, const int64_t* syms, const double* scalars) const;
  // The same with an explicit configuration and stream (nullptr: ingot's current stream): what an
  // autotuner times.
  void launch(void* const* bufs, const int64_t* syms, const double* scalars, const LaunchConfig& cfg,
              void* stream = nullptr) const;
  // A multi-tensor kernel reading its scalars from `device_scalars` (num_scalars doubles in device memory)
  // instead of taking them as arguments: a CUDA graph that captures this launch replays it with whatever the
  // buffer holds then (Note [Scalars read from the device], compile/exec/graph_replay.h).
  void launch_reading_device_scalars(void* const* bufs, const int64_t* syms, const double* device_scalars) const;

  // The workspace _colsplit launches have needed so far (0: the kernel never split its columns).
  size_t split_workspace_bytes() const;

  std::string symbol;
  KernelAbi abi;
  int device = 0;
  LaunchConfig config;
  std::shared_ptr<LoadedKernel> loaded;
};

// Called with (kernels ready, distinct kernels of the batch) after the lookups and as each NVRTC program
// finishes: what the compile progress line shows (the same as codegen::cpu::ProgressFn).
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

struct CudaCodegenOptions {
  std::string cache_dir;       // "" = cache::CompileCache::default_dir()
  bool use_disk_cache = true;  // false: compile in memory and persist nothing
  int max_parallel = 0;        // NVRTC programs compiled at once; 0 = the number of hardware threads
  LaunchConfig launch;         // the default launch configuration of every kernel
};

class CudaCodegen {
 public:
  explicit CudaCodegen(CudaCodegenOptions options = {});

  // Loaded kernels for `specs`, in order, on the current CUDA device. Identical kernels are compiled once:
  // within the batch, across calls on this object and, through the disk cache, across processes. `stats`
  // receives this call's counts and phase times (compiler_s is NVRTC, compiler_processes the programs).
  // Throws ingot::Error for an invalid spec (naming it) or an NVRTC failure (log + offending source lines).
  std::vector<CudaKernel> compile(const std::vector<KernelSpec>& specs, CodegenStats* stats = nullptr,
                                  const ProgressFn& progress = {});
  CudaKernel compile(const KernelSpec& spec, CodegenStats* stats = nullptr);

  CodegenStats stats() const;  // totals since construction
  const CudaCodegenOptions& options() const { return options_; }

  // One instance per process with the default options: kernels are shared by every graph compiled here.
  static CudaCodegen& shared();

 private:
  CudaCodegenOptions options_;
  mutable std::mutex mu_;
  std::map<std::pair<int, std::string>, CudaKernel> table_;  // (device, structural key) -> loaded kernel
  CodegenStats totals_;
};

// How many multi-tensor tables one kernel keeps uploaded before it frees them after a device synchronize (Note
// [Tables of per-bucket updates], cuda_codegen.cpp; tables a CUDA graph captured are never freed).
size_t multi_tensor_table_limit();

}  // namespace ingot::codegen::cuda
