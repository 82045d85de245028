// How `mode: max-autotune` reaches the cuBLASLt matmul (matmul.cu) without the runtime knowing about the
// compiler: a thread-local MatmulTuner, installed by a MatmulTuningScope around the matmul steps of a graph
// compiled with max-autotune (compile/autotune/cuda/tuner.cpp). Outside a scope (eager code, default and
// reduce-overhead modes) matmul.cu takes cuBLASLt's first heuristic exactly as before.
//
// Under a scope, for each call's signature (see matmul.cu: sizes, batch strides, transposes, dtype, whether
// beta is 0, operand alignments): a stored choice from find() is used as is; otherwise, while may_time()
// allows it, cuBLASLt's top kTopAlgos heuristics are timed on the device (CUDA events, a warm-up then the
// median of a few runs, writing a scratch copy of the output so the real one is computed once, by the
// winner) and the fastest is reported through chose(); with no time left the first heuristic is reported
// as "untuned" (empty algo). Algorithms travel as hex text of cuBLASLt's opaque cublasLtMatmulAlgo_t, and a
// stored one that cuBLASLt no longer accepts (cublasLtMatmulAlgoCheck) falls back to the heuristic.
// Declared without CUDA headers; defined in matmul.cu (CUDA builds only).
#pragma once

#include <optional>
#include <string>

namespace ingot::kernels::cuda {

constexpr int kTopAlgos = 32;  // heuristics timed per signature (8 -> 32: -0.1 ms per GPT-2 step, bench/RESULTS.md)

class MatmulTuner {
 public:
  virtual ~MatmulTuner() = default;
  // The algorithm chosen earlier for `signature` (hex), "" for "use the first heuristic", nullopt: unknown.
  virtual std::optional<std::string> find(const std::string& signature) = 0;
  // Whether an unknown signature may be timed now (the compile's time budget).
  virtual bool may_time() = 0;
  // The outcome for an unknown signature: `algo` the winner's hex ("" when nothing was timed), `ms` its
  // median time, `seconds` the wall time the search took, `candidates` how many algorithms were timed.
  virtual void chose(const std::string& signature, const std::string& algo, double ms, double seconds,
                     int candidates) = 0;
};

// Installs `tuner` for the matmuls this thread runs while the scope lives (scopes nest; nullptr disables).
class MatmulTuningScope {
 public:
  explicit MatmulTuningScope(MatmulTuner* tuner);
  ~MatmulTuningScope();
  MatmulTuningScope(const MatmulTuningScope&) = delete;
  MatmulTuningScope& operator=(const MatmulTuningScope&) = delete;

 private:
  MatmulTuner* previous_;
};

// "cublasLt <version>": part of the autotune database's device id.
std::string blas_version();

// The CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET a matmul descriptor gets on a GPU of `total_sms` under the carve-out
// now (Note [SM carve-out], runtime/sm_budget.h), read back from a descriptor set up as every product's is:
// 0 (unset) without a carve-out. Needs no GPU; the tests' seam.
int matmul_desc_sm_count_target(int total_sms);

}  // namespace ingot::kernels::cuda
