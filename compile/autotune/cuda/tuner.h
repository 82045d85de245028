// `mode: max-autotune` on CUDA: launch configurations of the generated kernels and cuBLASLt algorithms of the
// matmuls, chosen by timing candidates on the device and remembered in the autotune database
// (compile/autotune/autotune_db.h), so that a later compile reads the winners and times nothing.
//
// Generated kernels (at compile time, compile/pipeline.cpp): for each distinct kernel (structural key) the
// database is asked first; otherwise, while the budget lasts, every candidate of launch_candidates() runs on
// zero-filled scratch buffers of the kernel's extents (no real tensor is touched: every size and stride of a
// lowered Pointwise/RowReduction kernel is a constant, and loads read only their own index map, so zeros are
// as safe as any data), timed with CUDA events (one warm-up, then the median of five samples of a batch of
// launches), and the fastest wins; the heuristic config is always a candidate, so tuning never picks
// something slower than what default mode runs. Multi-tensor kernels (their sizes are run-time values) and
// kernels with run-time syms keep the heuristic config.
//
// Matmuls (on the first runs, runtime/kernels/cuda/matmul_tuning.h): the executable's steps that run a node
// eagerly (matmuls, attention, norms) run inside a MatmulTuningScope of the session, which looks signatures
// up in the same database and stores what matmul.cu timed.
//
// Budget: CompileOptions::autotune_budget_s is the time one compile may spend timing, kernels and matmuls
// together; once spent, what is left keeps the heuristic choice (counted as untuned in CompileStats).
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <map>
#include <string>
#include <vector>

#include "compile/api.h"
#include "compile/autotune/autotune_db.h"
#include "compile/codegen/cuda/cuda_codegen.h"
#include "compile/exec/executor.h"
#include "runtime/kernels/cuda/matmul_tuning.h"

namespace ingot::autotune {

// "<GPU name> sm_<cc> cudart <v> <nvrtc v> cublasLt <v>[ sm_target <SMs>]": what the database file is keyed by
// (sm_target: the SMs left by an SM carve-out, runtime/sm_budget.h).
std::string cuda_device_id(int device);

// The launch configurations timed for a kernel with this ABI, the heuristic `base` first (no duplicates):
// Pointwise: block threads {128, 256, 512, 1024} x grid cap {8, 32} waves x {vector, scalar} path;
// RowReduction: warp per row with {128, 256, 512, 1024}-thread blocks (4..32 rows per block), block per row
// with {0 (from the row length), 128, 256, 512, 1024} threads, and for transposed reductions lanes over rows
// with {8, 16, 32, 64} rows per block x {auto, 4, 16} column splits; each with and without the vector path
// (when the kernel has one). MultiTensor: only `base`.
std::vector<codegen::cuda::LaunchConfig> launch_candidates(const codegen::cuda::KernelAbi& abi,
                                                           const codegen::cuda::LaunchConfig& base);
// A config as database text ("block=256 rows=warp rbt=0 cr=32 cs=0 vec=1 waves=8") and back; decode
// returns false (leaving `cfg` unspecified) for anything it did not write.
std::string encode_config(const codegen::cuda::LaunchConfig& cfg);
bool decode_config(const std::string& text, codegen::cuda::LaunchConfig& cfg);
// The database key of a kernel: its structural key hashed (no names: identical kernels share it) and the
// renderer's fingerprint (new code generation, new measurements).
std::string kernel_key(const codegen::KernelSpec& spec);

// One max-autotune compile of a graph for one CUDA device.
class CudaSession : public kernels::cuda::MatmulTuner, public std::enable_shared_from_this<CudaSession> {
 public:
  // The database under opts.cache_dir, the budget opts.autotune_budget_s. `stats` receives the counts, the
  // matmul ones on the executable's first runs: it must outlive the executables tuned by this session (the
  // CompiledFunction's state owns both).
  static std::shared_ptr<CudaSession> start(const CompileOptions& opts, int device, CompileStats& stats);

  // Sets kernels[i].config for every kernel (specs[i] its spec), on the current device.
  void tune_kernels(const std::vector<codegen::KernelSpec>& specs, std::vector<codegen::cuda::CudaKernel>& kernels);
  // Wraps every step that runs an opaque node eagerly so that its matmuls run under this session.
  void tune_matmuls(const compiler::Graph& g, std::vector<compiler::ExecStep>& steps);

  std::optional<std::string> find(const std::string& signature) override;
  bool may_time() override;
  void chose(const std::string& signature, const std::string& algo, double ms, double seconds,
             int candidates) override;

 private:
  CudaSession(std::shared_ptr<AutotuneDb> db, int device, double budget_s, CompileStats& stats);
  // The fastest of `candidates` for `kernel` (ms through *best_ms); -1 when none ran.
  int time_candidates(const codegen::KernelSpec& spec, const codegen::cuda::CudaKernel& kernel,
                      const std::vector<codegen::cuda::LaunchConfig>& candidates, double* best_ms);

  std::shared_ptr<AutotuneDb> db_;
  int device_;
  double budget_s_;
  CompileStats* stats_;
  std::mutex mu_;
  double spent_s_ = 0;
  std::map<std::string, std::string> matmuls_;  // signature -> algo hex ("" = heuristic), this session
};

}  // namespace ingot::autotune
