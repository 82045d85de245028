// Helpers for the CUDA codegen tests: one code generator for the test binary, running a CudaKernel on GPU
// tensors, and building the same view on a CPU tensor and its GPU copy (the reference runs on the CPU one).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tests/compile/codegen/test_codegen_util.h"
#include "tests/testing.h"

#ifdef INGOT_WITH_CUDA_CODEGEN
#include "compile/codegen/cuda/cuda_codegen.h"
#include "compile/codegen/cuda/nvrtc_jit.h"
#include "compile/codegen/cuda/render_cuda.h"

namespace ingot::codegen::testing {

inline const Device kGpu = Device::cuda(0);

// No disk cache: kernels shared by several tests compile once per test binary.
inline cuda::CudaCodegen& cuda_codegen() {
  static cuda::CudaCodegen cg(cuda::CudaCodegenOptions{"", false, 4, {}});
  return cg;
}

inline void run_cuda(const cuda::CudaKernel& k, const std::vector<Tensor>& bufs, const std::vector<int64_t>& syms = {},
                     const std::vector<double>& scalars = {}, const cuda::LaunchConfig* cfg = nullptr) {
  std::vector<void*> ptrs;
  for (const Tensor& t : bufs) {
    EXPECT_TRUE(t.device().is_cuda()) << "kernel " << k.symbol << " given a CPU tensor";
    ptrs.push_back(t.data_ptr());
  }
  const std::vector<int64_t> s = syms.empty() ? std::vector<int64_t>{0} : syms;
  const std::vector<double> c = scalars.empty() ? std::vector<double>{0} : scalars;
  if (cfg)
    k.launch(ptrs.data(), s.data(), c.data(), *cfg);
  else
    k(ptrs.data(), s.data(), c.data());
}

inline Tensor host(const Tensor& t) { return t.to(Device::cpu()); }

// A view built the same way on a CPU tensor and on its GPU copy: equal values, equal layout.
struct Both {
  Tensor cpu, gpu;
};
inline Both both(const Tensor& base_cpu, const std::function<Tensor(const Tensor&)>& view = {}) {
  Tensor g = base_cpu.contiguous_raw().to(kGpu);
  Tensor c = base_cpu.contiguous_raw();
  if (!view) return {c, g};
  return {view(c).detach(), view(g).detach()};
}

// The launch configurations every row reduction is checked under: the heuristic, forced warp-per-row and
// block-per-row (vector path allowed), the scalar path, and lanes over rows (a partial last tile of rows,
// columns split three ways within a block).
// The last one also splits the columns over 5 blocks per tile where the kernel has a _colsplit function.
inline std::vector<cuda::LaunchConfig> row_configs() {
  std::vector<cuda::LaunchConfig> out(6);
  out[4].rows = cuda::LaunchConfig::Rows::Columns;
  out[4].col_rows = 8;
  out[4].col_splits = 3;
  out[4].col_grid_splits = 1;
  out[5] = out[4];
  out[5].col_splits = 2;
  out[5].col_grid_splits = 5;
  out[1].rows = cuda::LaunchConfig::Rows::WarpPerRow;
  out[1].block_threads = 128;
  out[2].rows = cuda::LaunchConfig::Rows::BlockPerRow;
  out[2].row_block_threads = 96;  // not a power of two: three warps combine through shared memory
  out[3].vectorize = false;
  return out;
}

}  // namespace ingot::codegen::testing
#endif
