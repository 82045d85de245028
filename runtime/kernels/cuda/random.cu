// CUDA Philox draws: the functions of runtime/rng.h, so element i of a draw equals the CPU kernel's element i
// (runtime/kernels/cpu/random.cpp) for the same seed and offset.
//
// Approach: one thread per Philox counter (four consecutive elements share one, runtime/rng.h); the four
// calls of the inlined header function on the same counter fold into one evaluation. Scaling runs in f64 with
// __dmul_rn / __dadd_rn, which nvcc never contracts into an FMA: the CPU computes x * (high - low) + low with
// separately rounded operations, and bit-equality depends on the GPU doing the same. The result is stored
// through float for 16-bit types, like the CPU's store_one.
#include "runtime/kernels/cuda/common.cuh"
#include "runtime/kernels/kernels.h"
#include "runtime/rng.h"

namespace ingot::kernels::cuda {
namespace {

constexpr int kBlock = 256;

template <bool kNormal>
__global__ void philox_kernel(void* out, DType dt, int64_t n, uint64_t seed, uint64_t offset, double scale,
                              double shift) {
  const uint64_t first = offset >> 2, last = (offset + static_cast<uint64_t>(n) - 1) >> 2;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t c = first + static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c <= last; c += step) {
#pragma unroll
    for (uint64_t lane = 0; lane < 4; ++lane) {
      const uint64_t e = c * 4 + lane;  // the element's Philox index
      if (e < offset || e >= offset + static_cast<uint64_t>(n)) continue;
      const float r = kNormal ? philox_normal(seed, e) : philox_uniform(seed, e);
      const double v = __dadd_rn(__dmul_rn(static_cast<double>(r), scale), shift);
      store_dyn<double>(out, dt, static_cast<int64_t>(e - offset), v);
    }
  }
}

template <bool kNormal>
void draw(const char* op, const Tensor& out, uint64_t seed, uint64_t offset, double scale, double shift) {
  check_same_device(op, {&out});
  INGOT_INTERNAL_CHECK(out.is_contiguous(), op, ": out must be contiguous");
  const int64_t n = out.numel();
  if (n == 0) return;
  LaunchContext ctx(out);
  const int64_t counters = static_cast<int64_t>(((offset + static_cast<uint64_t>(n) - 1) >> 2) - (offset >> 2)) + 1;
  philox_kernel<kNormal><<<grid_for(counters, kBlock, ctx.device), kBlock, 0, ctx.stream>>>(
      out.data_ptr(), out.dtype(), n, seed, offset, scale, shift);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rand_uniform(const Tensor& out, uint64_t seed, uint64_t offset, double low, double high) {
  draw<false>("rand_uniform", out, seed, offset, high - low, low);
}

void rand_normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std) {
  draw<true>("rand_normal", out, seed, offset, std, mean);
}

}  // namespace ingot::kernels::cuda
