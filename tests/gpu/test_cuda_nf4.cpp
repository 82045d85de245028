// The CUDA NF4 path against the CPU one on fresh random inputs (a new seed each run, printed on failure):
// dequantization bit for bit in every output dtype (both compute absmax and weights with separately rounded
// f32 operations), nf4_linear forward and input gradient within the matmul's dtype tolerance, and a tiny Llama
// with an NF4 base and LoRA adapters giving the CPU's loss and adapter gradients. Skips without a GPU.
#include <gtest/gtest.h>

#include <random>

#include "autograd/nn/lora.h"
#include "autograd/ops/nf4_linear.h"
#include "models/qlora.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/nf4.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/models/tiny_models.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

const Device kGpu = Device::cuda(0);

uint64_t fresh_seed() {
  const uint64_t s = std::random_device{}();
  manual_seed(s);
  return s;
}

// Relative error bound of a product over K terms accumulated in f32 and rounded once to `dt`.
double product_tol(DType dt) {
  switch (dt) {
    case DType::bf16: return 1e-2;
    case DType::f16: return 2e-3;
    default: return 1e-5;
  }
}

TEST(CudaNf4, DequantizeMatchesTheCpuKernelBitForBit) {
  INGOT_REQUIRE_CUDA();
  const uint64_t seed = fresh_seed();
  // 3 blocks (a partial absmax word and chunk), 300 blocks (two chunks), 8192 x 512 (65536 blocks).
  for (const Shape& shape : {Shape{3, 64}, Shape{150, 128}, Shape{8192, 512}}) {
    Tensor w = randn(shape, DType::f32, Device::cpu(), 0.0, 0.02);
    if (shape[0] > 3) w.as_strided({64}, {1}, 64).zero_();  // an all-zero block
    const Nf4Tensor cpu = nf4_quantize(w, "w"), gpu = cpu.to(kGpu);
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const Tensor a = nf4_dequantize(gpu, dt), b = nf4_dequantize(cpu, dt);
      ASSERT_EQ(a.device(), kGpu);
      EXPECT_EQ(count_unequal(a, b), 0) << dtype_name(dt) << " " << shape_str(shape) << " seed " << seed;
    }
  }
}

// Note [NF4 codebook and stores] (runtime/kernels/cuda/nf4.cu): an output that starts 8 bytes past a 16-byte
// boundary (a contiguous slice of a larger buffer) takes the element-by-element stores, and still equals the CPU's.
TEST(CudaNf4, DequantizeIntoAnUnalignedOutputMatchesTheCpuKernel) {
  INGOT_REQUIRE_CUDA();
  const uint64_t seed = fresh_seed();
  Tensor w = randn({150, 128}, DType::f32, Device::cpu(), 0.0, 0.02);
  const Nf4Tensor cpu = nf4_quantize(w, "w"), gpu = cpu.to(kGpu);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const int64_t n = w.numel(), skip = 8 / static_cast<int64_t>(itemsize(dt));
    Tensor buffer = zeros({n + skip}, dt, kGpu);
    Tensor out = narrow(buffer, 0, skip, n);
    ASSERT_NE(reinterpret_cast<uintptr_t>(out.data_ptr()) % 16, 0u);
    INGOT_KERNEL_CALL(kGpu, nf4_dequantize, out, gpu.codes, gpu.absmax_codes, gpu.absmax_scales, gpu.absmax_map,
                      static_cast<double>(gpu.absmax_offset));
    EXPECT_EQ(count_unequal(reshape(out, w.shape()), nf4_dequantize(cpu, dt)), 0) << dtype_name(dt) << " seed " << seed;
  }
}

TEST(CudaNf4, QuantizingAGpuWeightGivesTheCpuCodesOnTheGpu) {
  INGOT_REQUIRE_CUDA();
  const uint64_t seed = fresh_seed();
  const Tensor w = randn({256, 256}, DType::bf16);
  const Nf4Tensor on_gpu = nf4_quantize(w.to(kGpu), "w"), on_cpu = nf4_quantize(w, "w");
  EXPECT_EQ(on_gpu.device(), kGpu);
  EXPECT_EQ(count_unequal(on_gpu.codes, on_cpu.codes), 0) << "seed " << seed;
  EXPECT_EQ(count_unequal(on_gpu.absmax_codes, on_cpu.absmax_codes), 0) << "seed " << seed;
  EXPECT_EQ(on_gpu.absmax_offset, on_cpu.absmax_offset);
}

TEST(CudaNf4, LinearForwardAndInputGradientMatchTheCpu) {
  INGOT_REQUIRE_CUDA();
  const uint64_t seed = fresh_seed();
  const Nf4Tensor q_cpu = nf4_quantize(randn({384, 512}, DType::f32, Device::cpu(), 0.0, 0.05), "proj.weight");
  const Nf4Tensor q_gpu = q_cpu.to(kGpu);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor x0 = randn({3, 37, 512}).to(dt), g0 = randn({3, 37, 384}).to(dt);
    Tensor xc = x0.clone_raw().set_requires_grad(true), xg = x0.to(kGpu).set_requires_grad(true);
    Tensor yc = nf4_linear(xc, q_cpu), yg = nf4_linear(xg, q_gpu);
    ASSERT_EQ(yg.device(), kGpu);
    EXPECT_LT(rel_norm_error(yg, yc), product_tol(dt)) << dtype_name(dt) << " seed " << seed;
    yc.backward(g0);
    yg.backward(g0.to(kGpu));
    EXPECT_LT(rel_norm_error(xg.grad(), xc.grad()), product_tol(dt)) << dtype_name(dt) << " seed " << seed;
  }
}

TEST(CudaNf4, TinyLlamaWithAnNf4BaseGivesTheCpuLossAndAdapterGradients) {
  INGOT_REQUIRE_CUDA();
  const uint64_t seed = fresh_seed();
  const nn::LoRAConfig lc{.rank = 4, .alpha = 8, .dropout = 0.0, .target_modules = {"q_proj", "v_proj", "down_proj"}};
  models::Llama cpu(tiny_llama_config()), gpu(tiny_llama_config());
  gpu.load_state_dict(cpu.state_dict());
  nn::apply_lora(cpu, lc);
  nn::apply_lora(gpu, lc);
  for (auto& [name, t] : nn::lora_state_dict(cpu)) {
    Tensor w = t;
    if (name.find("lora_B") != std::string::npos) w.copy_(randn(t.shape(), t.dtype(), t.device(), 0.0, 0.05));
  }
  gpu.load_state_dict(cpu.state_dict());
  models::quantize_base_nf4(cpu);
  models::quantize_base_nf4(gpu);
  gpu.to(kGpu);
  models::quantized_base_to(gpu, kGpu);
  auto [ids, tgt] = repeating_batch(2, 12);
  Tensor lc_ = cpu.loss(ids, tgt), lg = gpu.loss(ids.to(kGpu), tgt.to(kGpu));
  EXPECT_NEAR(lg.item(), lc_.item(), 1e-4 * std::fabs(lc_.item())) << "seed " << seed;
  lc_.backward();
  lg.backward();
  const auto gpu_params = nn::lora_state_dict(gpu);
  const auto cpu_params = nn::lora_state_dict(cpu);
  ASSERT_EQ(gpu_params.size(), cpu_params.size());
  for (size_t i = 0; i < cpu_params.size(); ++i)
    EXPECT_LT(rel_norm_error(gpu_params[i].second.grad(), cpu_params[i].second.grad()), 1e-4)
        << cpu_params[i].first << " seed " << seed;
}

}  // namespace
}  // namespace ingot::testing
