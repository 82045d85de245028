// The CUDA 8-bit AdamW kernel (runtime/kernels/cuda/adamw8bit.cu) against the CPU one, and the optimizer on a GPU
// (eager and compiled) against the CPU. Both kernels do the same f32 operations in the same order with the same
// map search, so parameters, codes and absmax values must be equal bit for bit; the tolerance is zero.
#include <gtest/gtest.h>

#include "compile/api.h"
#include "optim/optimizer.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/quant8.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

const Device kGpu = Device::cuda(0);

// Random bytes as codes (any state, not only what a previous step could write), in the i32 layout.
Tensor random_codes(int64_t n) {
  std::vector<double> u = rand({n}, DType::f64).to_vector();
  Tensor t = zeros({quant8_code_words(n)}, DType::i32);
  auto* b = static_cast<uint8_t*>(t.data_ptr());
  for (int64_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(std::min(255.0, u[static_cast<size_t>(i)] * 256.0));
  return t;
}

struct Lists {
  std::vector<Tensor> p, g, mq, ma, vq, va;
  Lists to(Device d) const {
    Lists o;
    for (auto [src, dst] : {std::pair{&p, &o.p}, {&g, &o.g}, {&mq, &o.mq}, {&ma, &o.ma}, {&vq, &o.vq}, {&va, &o.va}})
      for (const Tensor& t : *src) dst->push_back(t.to(d));
    return o;
  }
};

// f32 parameters, and bf16 ones without masters whose updates are rounded stochastically (Note [Stochastic
// rounding], runtime/kernels/scalar_math.h): the same bits on both devices either way.
class CudaAdamW8bitParams : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(CudaParamDtypes, CudaAdamW8bitParams, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST_P(CudaAdamW8bitParams, UpdatesEqualCpuBitForBitOverStepsFromRandomState) {
  INGOT_REQUIRE_CUDA();
  manual_seed(77);
  // One block, a partial last block (unaligned, below), many grid-stride waves, a size under 256; grads of every
  // float dtype.
  const int64_t sizes[] = {4096, 5000, 3000001, 200, 70001};
  const DType grad_types[] = {DType::f32, DType::bf16, DType::f16, DType::f64, DType::f32};
  Lists cpu;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    const int64_t n = sizes[i];
    cpu.p.push_back(randn({n}).to(GetParam()));
    cpu.g.push_back((randn({n}) * 0.1).to(grad_types[i]));
    cpu.mq.push_back(random_codes(n));
    cpu.vq.push_back(random_codes(n));
    cpu.ma.push_back(rand({quant8_blocks(n)}) * 0.01);
    cpu.va.push_back(rand({quant8_blocks(n)}) * 1e-4);
  }
  cpu.ma[0].data<float>()[3] = 0.0f;  // a block whose state is zero
  Lists gpu = cpu.to(kGpu);
  // The kernel moves whole blocks 16 bytes at a time where the tensors are aligned (the sizes above) and element by
  // element where not: parameter 1 and its gradient as views from element 1 of longer buffers.
  for (Lists* l : {&cpu, &gpu})
    for (std::vector<Tensor>* list : {&l->p, &l->g}) {
      const Tensor& t = (*list)[1];
      Tensor view = empty({t.numel() + 1}, t.dtype(), t.device()).as_strided(t.shape(), {1}, 1);
      view.copy_(t);
      (*list)[1] = view;
    }
  const Tensor smap = quant8_map_tensor(quant8_signed_map()), umap = quant8_map_tensor(quant8_unsigned_map());
  const Tensor smap_gpu = smap.to(kGpu), umap_gpu = umap.to(kGpu);
  kernels::AdamWArgs args{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (int64_t step = 1; step <= 3; ++step) {
    args.step = step;
    args.grad_scale = step == 2 ? 0.7 : 1.0;
    kernels::cpu::adamw8bit_multi(cpu.p, cpu.g, cpu.mq, cpu.ma, cpu.vq, cpu.va, smap, umap, args);
    kernels::cuda::adamw8bit_multi(gpu.p, gpu.g, gpu.mq, gpu.ma, gpu.vq, gpu.va, smap_gpu, umap_gpu, args);
  }
  for (size_t i = 0; i < std::size(sizes); ++i) {
    EXPECT_EQ(count_unequal(gpu.p[i].to(Device::cpu()), cpu.p[i]), 0) << "param " << i;
    EXPECT_EQ(count_unequal(gpu.mq[i].to(Device::cpu()), cpu.mq[i]), 0) << "exp_avg codes " << i;
    EXPECT_EQ(count_unequal(gpu.vq[i].to(Device::cpu()), cpu.vq[i]), 0) << "exp_avg_sq codes " << i;
    EXPECT_EQ(count_unequal(gpu.ma[i].to(Device::cpu()), cpu.ma[i]), 0) << "exp_avg absmax " << i;
    EXPECT_EQ(count_unequal(gpu.va[i].to(Device::cpu()), cpu.va[i]), 0) << "exp_avg_sq absmax " << i;
  }
  // Mismatched operands are refused with the operand named.
  Lists bad = gpu;
  bad.ma[1] = zeros({3}, DType::f32, kGpu);
  EXPECT_THROW(kernels::cuda::adamw8bit_multi(bad.p, bad.g, bad.mq, bad.ma, bad.vq, bad.va, smap_gpu, umap_gpu, args),
               Error);
}

// The optimizer on the GPU, eager and compiled (default and reduce-overhead), against the eager CPU run.
TEST(CudaAdamW8bit, OptimizerOnTheGpuEagerAndCompiledMatchesTheCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(5);
  const Tensor x = randn({128, 64}), y = randn({128, 96}), w0 = randn({64, 96}) * 0.1, b0 = zeros({96});
  const optim::AdamWOptions o{.lr = 1e-2, .weight_decay = 0.01};
  auto run = [&](Device d, const char* mode) {
    std::vector<Tensor> ps = {leaf(w0.to(d).clone_raw()), leaf(b0.to(d).clone_raw())};
    optim::AdamW8bit opt(ps, o);
    const Tensor xd = x.to(d), yd = y.to(d);
    auto fn = [&](const std::vector<Tensor>& in) {
      Tensor loss = mean(square(sub(add(matmul(in[0], ps[0]), ps[1]), in[1])));
      loss.backward();
      opt.step();
      opt.zero_grad();
      return std::vector<Tensor>{loss};
    };
    CompileOptions co;
    if (mode) co.mode = *parse_compile_mode(mode);
    CompiledFunction step = compile(fn, co);
    for (int i = 0; i < 6; ++i) {
      opt.set_lr(o.lr * (1.0 - 0.1 * i));
      if (mode)
        step({xd, yd});
      else
        fn({xd, yd});
    }
    return std::vector<Tensor>{ps[0].to(Device::cpu()), ps[1].to(Device::cpu()),
                               opt.state_dict().at("0.exp_avg_q").to(Device::cpu())};
  };
  const std::vector<Tensor> cpu = run(Device::cpu(), nullptr);
  for (const char* mode : {static_cast<const char*>(nullptr), "default", "reduce-overhead"}) {
    SCOPED_TRACE(mode ? mode : "eager");
    const std::vector<Tensor> gpu = run(kGpu, mode);
    // The products (cuBLASLt vs the CPU BLAS) round differently, so the gradients differ in their last bits.
    EXPECT_LT(rel_norm_error(gpu[0], cpu[0]), 1e-4);
    EXPECT_LT(rel_norm_error(gpu[1], cpu[1]), 1e-4);
  }
}

}  // namespace
}  // namespace ingot::testing
