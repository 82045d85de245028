// CPU Philox draws: the same (seed, index) -> value mapping as the CUDA kernels (runtime/rng.h).
#include "runtime/kernels/cpu/loops.h"
#include "runtime/kernels/kernels.h"
#include "runtime/rng.h"

namespace ingot::kernels::cpu {

template <typename Gen>
static void draw(const Tensor& out, Gen gen) {
  const int64_t n = out.numel();
  dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = out.data<T>();
#pragma omp parallel for if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) store_one(p + i, gen(static_cast<uint64_t>(i)));
  });
}

void rand_uniform(const Tensor& out, uint64_t seed, uint64_t offset, double low, double high) {
  INGOT_INTERNAL_CHECK(out.is_contiguous(), "rand_uniform: out must be contiguous");
  draw(out, [=](uint64_t i) {
    return static_cast<double>(philox_uniform(seed, offset + i)) * (high - low) + low;
  });
}

void rand_normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std) {
  INGOT_INTERNAL_CHECK(out.is_contiguous(), "rand_normal: out must be contiguous");
  draw(out, [=](uint64_t i) { return static_cast<double>(philox_normal(seed, offset + i)) * std + mean; });
}

}  // namespace ingot::kernels::cpu
