// How many of a GPU's multiprocessors (SMs) the compute kernels plan for: all of them, or all but an SM carve-out
// left to the communication kernels that run beside them (Note [SM carve-out]).
//
// Note [SM carve-out]
// ~~~~~~~~~~~~~~~~~~~
// Some kernels size their grid to the SM count and loop inside each CTA (persistent kernels): cuBLASLt's Hopper
// GEMMs, the own wgmma GELU product (runtime/kernels/cuda/gemm_sm90.cu), the staged cross-entropy rows. Beside
// an NCCL collective (a data-parallel step's bucket all-reduce during the backward) a few SMs hold NCCL CTAs, so
// such a grid no longer fits in one wave: the CTAs left over wait for a whole persistent loop and the kernel
// takes up to twice as long. A carve-out of N sizes these grids for SMs - N instead, leaving N SMs to NCCL:
// cuBLASLt through CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET (its heuristic sees the target too, so it picks a
// kernel for that SM count), the own kernels and the grid-stride caps (runtime/kernels/cuda/common.cu, the
// generated kernels' Launcher in compile/codegen/cuda/cuda_codegen.cpp) through usable_sms(). PyTorch's async
// tensor parallel does the same (torch._C._set_sm_carveout_experimental).
//
// The carve-out is process-wide and 0 (off) unless set: INGOT_SM_CARVEOUT (read at first use), or
// set_sm_carveout() from `distributed.sm_carveout` (a data-parallel run, recipes/data_parallel.cpp) or a bench's
// --sm-carveout; the last set wins, and errors name where it came from. Kernel choices change with it but not
// what a step computes (beyond the order of floating-point sums), so the config key stays out of the resume hash.
// Plans tuned for one SM budget are not reused under another: the cuBLASLt tuning signature (matmul.cu) and the
// autotune database's device id (compile/autotune/cuda/tuner.cpp) carry sm_budget_key().
#pragma once

#include <string>

namespace ingot {

// The carve-out written as text ("8"): an integer >= 0, else an ingot::Error naming `source` (the env variable,
// config key or flag it came from).
int parse_sm_carveout(const std::string& text, const std::string& source);
// Sets the process-wide carve-out (>= 0; else an error naming `source`), overriding INGOT_SM_CARVEOUT.
void set_sm_carveout(int sms, const std::string& source);
// The carve-out now: the last set_sm_carveout(), else INGOT_SM_CARVEOUT, else 0. A bad INGOT_SM_CARVEOUT throws.
int sm_carveout();
// Where the carve-out came from ("INGOT_SM_CARVEOUT", "distributed.sm_carveout", "--sm-carveout"; "" when off).
std::string sm_carveout_source();

// The SMs kernels may plan for on a GPU of `total_sms`: total_sms - carve-out; an error naming the carve-out's
// source when that leaves none.
int sms_left(int total_sms);
// sms_left() of CUDA `device`'s multiprocessor count.
int usable_sms(int device);
namespace cuda {
// All multiprocessors of CUDA `device` (cached; runtime/cuda/runtime.cpp, or a "built without CUDA" error).
int multiprocessor_count(int device);
}  // namespace cuda
// cuBLASLt's CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET for a GPU of `total_sms`: 0 (the attribute left unset: the
// device's own count) without a carve-out, else sms_left(total_sms).
int sm_count_target(int total_sms);
// What cache keys of tuned plans append: "" without a carve-out, else " sm_target <sms_left(total_sms)>".
std::string sm_budget_key(int total_sms);

// Sets a carve-out for a scope and restores the previous one (tests, a bench's one configuration).
class SmCarveoutScope {
 public:
  SmCarveoutScope(int sms, const std::string& source);
  ~SmCarveoutScope();
  SmCarveoutScope(const SmCarveoutScope&) = delete;
  SmCarveoutScope& operator=(const SmCarveoutScope&) = delete;

 private:
  int previous_;
  std::string previous_source_;
};

}  // namespace ingot
