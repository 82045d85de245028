// The whole training step compiled for a GPU (generated CUDA kernels through NVRTC, matmuls and attention
// through the eager cuBLASLt/cuDNN kernels) against the eager GPU step and against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "compile/step_fixture.h"
#include "runtime/file_util.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

const Device kGpu = Device::cuda(0);

// Each test compiles into its own cache directory: the first compile of a process must really run NVRTC.
CompileOptions fresh_cache(const TempDir& dir) {
  CompileOptions o;
  o.cache_dir = dir.path();
  return o;
}

TEST(CompileCudaStep, TinyGpt2TwentyStepsMatchEagerOnTheGpu) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  StepRun eager = train_steps(tiny_gpt2, false, 20, {}, 2, 8, kGpu);
  StepRun comp = train_steps(tiny_gpt2, true, 20, fresh_cache(dir), 2, 8, kGpu);
  expect_same_training(eager, comp);
  EXPECT_EQ(comp.stats.compiles, 1);
  EXPECT_TRUE(comp.stats.graph_breaks.empty());
  EXPECT_GT(comp.stats.kernels, 0) << "fused groups run as generated CUDA kernels";
  EXPECT_GT(comp.stats.kernels_generated, 0) << "a fresh cache directory compiles with NVRTC";
  std::printf("[ kernels  ] %lld ops (%lld not views) -> %lld launches, %lld generated kernels (%lld compiled)\n",
              static_cast<long long>(comp.stats.ops_before), static_cast<long long>(comp.stats.compute_ops),
              static_cast<long long>(comp.stats.launches), static_cast<long long>(comp.stats.kernels),
              static_cast<long long>(comp.stats.kernels_generated));
}

// Same initial weights (made on the CPU, then moved), same batches: the GPU-compiled run follows the CPU's
// eager run. Looser than eager-vs-compiled on one device: cuBLASLt and the CPU's BLAS sum in different orders.
TEST(CompileCudaStep, TinyGpt2CompiledOnTheGpuMatchesTheCpu) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  StepRun cpu = train_steps(tiny_gpt2, false, 20);
  StepRun gpu = train_steps(tiny_gpt2, true, 20, fresh_cache(dir), 2, 8, kGpu);
  expect_same_training(cpu, gpu, 3e-3, 3e-4);
}

TEST(CompileCudaStep, TinyLlamaTwentyStepsMatchEagerOnTheGpu) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  StepRun eager = train_steps(tiny_llama, false, 20, {}, 2, 8, kGpu);
  StepRun comp = train_steps(tiny_llama, true, 20, fresh_cache(dir), 2, 8, kGpu);
  expect_same_training(eager, comp);
  EXPECT_TRUE(comp.stats.graph_breaks.empty());
  EXPECT_GT(comp.stats.kernels, 0);
}

// bf16 compute (matmuls and attention in bf16, norms/softmax/loss in f32): compiled and eager round the same
// bf16 products, but fused f32 chains differ in their last bits, which bf16 casts can magnify by one ulp
// (2^-8 relative); losses agree to 1e-2 relative over 10 steps.
TEST(CompileCudaStep, Bf16ComputeCompiledMatchesEagerOnTheGpu) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  auto bf16 = [](auto& m) { m->set_compute_dtype(DType::bf16); };
  StepRun eager = train_steps(tiny_gpt2, false, 10, {}, 4, 16, kGpu, bf16);
  StepRun comp = train_steps(tiny_gpt2, true, 10, fresh_cache(dir), 4, 16, kGpu, bf16);
  for (size_t i = 0; i < eager.losses.size(); ++i)
    EXPECT_NEAR(comp.losses[i], eager.losses[i], 1e-2 * std::abs(eager.losses[i])) << "step " << i;
  EXPECT_LT(eager.losses.back(), eager.losses.front() - 0.5);
  EXPECT_GT(comp.stats.kernels, 0);
}

// A second compile of the same step in the same cache directory loads every cubin from disk.
TEST(CompileCudaStep, WarmCacheCompilesNothing) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-compile-cuda-");
  StepRun cold = train_steps(tiny_gpt2, true, 2, fresh_cache(dir), 2, 8, kGpu);
  StepRun warm = train_steps(tiny_gpt2, true, 2, fresh_cache(dir), 2, 8, kGpu);
  EXPECT_GT(cold.stats.kernels_generated, 0);
  EXPECT_EQ(warm.stats.kernels_generated, 0) << "kernels come from the in-process table or the disk cache";
  EXPECT_EQ(warm.stats.kernels, cold.stats.kernels);
}

}  // namespace
}  // namespace ingot::testing
