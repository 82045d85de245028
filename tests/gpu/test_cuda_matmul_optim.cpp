// CUDA matmul (cuBLASLt / cuBLAS) and the multi-tensor optimizer kernels against their CPU versions.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "runtime/cuda_runtime.h"
#include "runtime/kernels/cuda/gemm_sm90.h"
#include "runtime/kernels/kernels.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/testing.h"
#ifdef INGOT_WITH_CUDA
#include "runtime/cuda/check.h"
#endif

namespace ingot::testing {
namespace {

namespace kc = kernels::cpu;
namespace kg = kernels::cuda;

const Device kGpu = Device::cuda(0);

struct MatmulCase {
  int64_t batch, batch_a, batch_b, m, n, k;
};
// Plain, batched, broadcast on either side (batch stride 0), odd sizes, a long K.
const MatmulCase kMatmulCases[] = {{1, 1, 1, 64, 48, 32}, {3, 3, 3, 17, 29, 13}, {4, 1, 4, 33, 8, 70},
                                   {5, 5, 1, 7, 65, 40},  {2, 2, 2, 1, 1, 1},    {1, 1, 1, 96, 80, 1000}};

// ||gpu - cpu|| / ||cpu||: f32 without TF32 and f64 match to their rounding; bf16/f16 outputs are rounded from
// f32 accumulators that differ in summation order.
double matmul_tol(DType t) {
  switch (t) {
    case DType::f32: return 1e-5;
    case DType::f64: return 1e-12;
    case DType::bf16: return 1e-2;
    default: return 2e-3;
  }
}

TEST(CudaMatmul, MatchesCpuForTransposesBroadcastBatchesAndBeta) {
  INGOT_REQUIRE_CUDA();
  manual_seed(31);
  for (DType dt : kFloatDTypes) {
    for (const MatmulCase& c : kMatmulCases) {
      for (int trans = 0; trans < 4; ++trans) {
        const bool ta = trans & 1, tb = trans & 2;
        for (auto [alpha, beta] : {std::pair{1.0, 0.0}, std::pair{0.5, 1.5}}) {
          Operand a = make_operand(ta ? Shape{c.batch_a, c.k, c.m} : Shape{c.batch_a, c.m, c.k}, dt, Layout::Contiguous);
          Operand b = make_operand(tb ? Shape{c.batch_b, c.n, c.k} : Shape{c.batch_b, c.k, c.n}, dt, Layout::Contiguous);
          const Shape os{c.batch, c.m, c.n};
          // beta == 0 must ignore what out holds (NaN here); beta != 0 accumulates into random values.
          Tensor ref, out;
          if (beta == 0.0) {
            ref = empty(os, dt);
            out = poisoned(os, dt, kGpu);
          } else {
            Operand init = make_operand(os, dt, Layout::Contiguous);
            ref = init.cpu.clone_raw();
            out = init.gpu.clone_raw();
          }
          kc::matmul(ref, a.cpu, b.cpu, ta, tb, alpha, beta);
          kg::matmul(out, a.gpu, b.gpu, ta, tb, alpha, beta);
          EXPECT_LE(rel_norm_error(out, ref), matmul_tol(dt))
              << dtype_name(dt) << " batch " << c.batch << " (" << c.batch_a << ", " << c.batch_b << ") M" << c.m
              << " N" << c.n << " K" << c.k << (ta ? " a^T" : "") << (tb ? " b^T" : "") << " alpha " << alpha
              << " beta " << beta;
        }
      }
    }
  }
}

// A linear layer's product with its bias: cuBLASLt's bias epilogue where it applies (2-D, aligned bias), the
// broadcast-then-accumulate path for a batch and for a bias one element into its buffer.
TEST(CudaMatmul, BiasEpilogueMatchesCpuAndTheFallbackPaths) {
  INGOT_REQUIRE_CUDA();
  manual_seed(33);
  for (DType dt : kFloatDTypes) {
    for (const MatmulCase& c : {MatmulCase{1, 1, 1, 64, 48, 32}, MatmulCase{1, 1, 1, 130, 72, 200},
                                MatmulCase{3, 3, 1, 17, 24, 13}}) {
      for (int trans = 0; trans < 4; ++trans) {
        for (bool misaligned : {false, true}) {
          const bool ta = trans & 1, tb = trans & 2;
          Operand a = make_operand(ta ? Shape{c.batch_a, c.k, c.m} : Shape{c.batch_a, c.m, c.k}, dt, Layout::Contiguous);
          Operand b = make_operand(tb ? Shape{c.batch_b, c.n, c.k} : Shape{c.batch_b, c.k, c.n}, dt, Layout::Contiguous);
          Operand bias_buf = make_operand({c.n + 1}, dt, Layout::Contiguous);
          auto bias_of = [&](const Tensor& t) { return t.as_strided({c.n}, {1}, misaligned ? 1 : 0); };
          const Shape os{c.batch, c.m, c.n};
          Tensor ref = empty(os, dt), out = poisoned(os, dt, kGpu);
          kc::matmul_bias(ref, a.cpu, b.cpu, ta, tb, bias_of(bias_buf.cpu).contiguous_raw());
          kg::matmul_bias(out, a.gpu, b.gpu, ta, tb, bias_of(bias_buf.gpu));
          EXPECT_LE(rel_norm_error(out, ref), matmul_tol(dt))
              << dtype_name(dt) << " batch " << c.batch << " M" << c.m << " N" << c.n << " K" << c.k
              << (ta ? " a^T" : "") << (tb ? " b^T" : "") << (misaligned ? " misaligned bias" : "");
        }
      }
    }
  }
}

// The GELU backward folded into the product (cuBLASLt's DGELU epilogue, then a column sum for the bias gradient),
// with and without the bias gradient, against the CPU kernel; N = 36 (not a multiple of 8) takes the unfused path.
TEST(CudaMatmul, DgeluEpilogueMatchesCpuWithAndWithoutTheBiasGradient) {
  INGOT_REQUIRE_CUDA();
  manual_seed(34);
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    for (const MatmulCase& c : {MatmulCase{1, 1, 1, 256, 192, 64}, MatmulCase{1, 1, 1, 100, 36, 40}}) {
      for (int trans = 0; trans < 4; ++trans) {
        for (bool with_dbias : {false, true}) {
          const bool ta = trans & 1, tb = trans & 2;
          Operand a = make_operand(ta ? Shape{1, c.k, c.m} : Shape{1, c.m, c.k}, dt, Layout::Contiguous);
          Operand b = make_operand(tb ? Shape{1, c.n, c.k} : Shape{1, c.k, c.n}, dt, Layout::Contiguous);
          Operand pre = make_operand({c.m, c.n}, dt, Layout::Contiguous, [](double x) { return 3 * x; });
          const Shape os{1, c.m, c.n};
          Tensor ref = empty(os, dt), out = poisoned(os, dt, kGpu);
          Tensor dref = with_dbias ? empty({c.n}, dt) : Tensor(), dgot = with_dbias ? poisoned({c.n}, dt, kGpu) : Tensor();
          kc::matmul_dgelu(ref, dref, a.cpu, b.cpu, ta, tb, pre.cpu);
          kg::matmul_dgelu(out, dgot, a.gpu, b.gpu, ta, tb, pre.gpu);
          const std::string at = detail::str_cat(dtype_name(dt), " M", c.m, " N", c.n, " K", c.k, ta ? " a^T" : "",
                                                 tb ? " b^T" : "", with_dbias ? " dbias" : "");
          EXPECT_LE(rel_norm_error(out, ref), 2 * matmul_tol(dt)) << at;
          if (with_dbias) {
            EXPECT_LE(rel_norm_error(dgot, dref), 2 * matmul_tol(dt)) << at;
          }
        }
      }
    }
  }
}

// The GELU folded into a linear's product (cuBLASLt's GELU_AUX_BIAS epilogue: the GELU and the pre-activation
// the backward reads) against the CPU kernel; N = 36 and a misaligned bias take the unfused path.
TEST(CudaMatmul, GeluAuxBiasEpilogueMatchesCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(35);
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    for (const MatmulCase& c : {MatmulCase{1, 1, 1, 256, 192, 64}, MatmulCase{1, 1, 1, 100, 36, 40},
                                MatmulCase{1, 1, 1, 1024, 3072, 768}}) {
      for (int trans = 0; trans < 4; ++trans) {
        for (bool misaligned : {false, true}) {
          const bool ta = trans & 1, tb = trans & 2;
          Operand a = make_operand(ta ? Shape{1, c.k, c.m} : Shape{1, c.m, c.k}, dt, Layout::Contiguous);
          Operand b = make_operand(tb ? Shape{1, c.n, c.k} : Shape{1, c.k, c.n}, dt, Layout::Contiguous);
          Operand bias_buf = make_operand({c.n + 1}, dt, Layout::Contiguous);
          auto bias_of = [&](const Tensor& t) { return t.as_strided({c.n}, {1}, misaligned ? 1 : 0); };
          const Shape os{1, c.m, c.n};
          Tensor ref = empty(os, dt), pre_ref = empty(os, dt);
          Tensor out = poisoned(os, dt, kGpu), pre = poisoned(os, dt, kGpu);
          kc::matmul_bias_gelu(ref, pre_ref, a.cpu, b.cpu, ta, tb, bias_of(bias_buf.cpu).contiguous_raw());
          kg::matmul_bias_gelu(out, pre, a.gpu, b.gpu, ta, tb, bias_of(bias_buf.gpu).contiguous_raw());
          const std::string at = detail::str_cat(dtype_name(dt), " M", c.m, " N", c.n, " K", c.k, ta ? " a^T" : "",
                                                 tb ? " b^T" : "", misaligned ? " misaligned bias" : "");
          EXPECT_LE(rel_norm_error(pre, pre_ref), matmul_tol(dt)) << at;
          // The CPU's GELU reads the rounded pre-activation, cuBLASLt's the f32 one.
          EXPECT_LE(rel_norm_error(out, ref), 2 * matmul_tol(dt)) << at;
        }
      }
    }
  }
}

// The own Hopper GELU products (Note [Own GELU products on Hopper], runtime/kernels/cuda/gemm_sm90.cu) against the
// CPU kernels, called directly (so a run that silently fell back to cuBLASLt fails) and through matmul_bias_gelu /
// matmul_dgelu with the kernel on and off; B both K-major and MN-major; several tiles per CTA and a k of 12 steps.
TEST(CudaMatmul, OwnHopperGeluProductsMatchCpu) {
  INGOT_REQUIRE_CUDA();
  if (!kg::sm90::available(0)) GTEST_SKIP() << "needs a compute capability 9.0 GPU and an sm_90a build";
  manual_seed(36);
  const DType dt = DType::bf16;
  struct Case {
    int64_t m, n, k;
  };
  // The last has more tile pairs (160) than an H100 / H200 runs clusters at once (66): each cluster's consumers
  // take turns over several tiles, and with k = 128 the stage ring wraps inside a tile.
  for (const Case& c : {Case{512, 256, 192}, Case{1024, 640, 768}, Case{256, 128, 64}, Case{4096, 1280, 128}}) {
    for (bool tb : {true, false}) {
      const std::string at = detail::str_cat("M", c.m, " N", c.n, " K", c.k, tb ? " b [n, k]" : " b [k, n]");
      Operand a = make_operand({1, c.m, c.k}, dt, Layout::Contiguous);
      Operand b = make_operand(tb ? Shape{1, c.n, c.k} : Shape{1, c.k, c.n}, dt, Layout::Contiguous);
      Operand bias = make_operand({c.n}, dt, Layout::Contiguous);
      Operand pre_in = make_operand({c.m, c.n}, dt, Layout::Contiguous, [](double x) { return 3 * x; });
      const Shape os{1, c.m, c.n};
      Tensor ref = empty(os, dt), pre_ref = empty(os, dt), dref = empty(os, dt), dbias_ref = empty({c.n}, dt);
      kc::matmul_bias_gelu(ref, pre_ref, a.cpu, b.cpu, false, tb, bias.cpu);
      kc::matmul_dgelu(dref, dbias_ref, a.cpu, b.cpu, false, tb, pre_in.cpu);
      for (bool direct : {true, false}) {
        for (bool own : {true, false}) {
          if (direct && !own) continue;
          kg::sm90::set_enabled(own);
          Tensor out = poisoned(os, dt, kGpu), pre = poisoned(os, dt, kGpu), dout = poisoned(os, dt, kGpu);
          Tensor dbias = poisoned({c.n}, dt, kGpu);
          if (direct) {
            using kg::sm90::GeluEpilogue;
            const int m = static_cast<int>(c.m), n = static_cast<int>(c.n), k = static_cast<int>(c.k);
            ASSERT_TRUE(kg::sm90::gelu_gemm({GeluEpilogue::kGeluAuxBias, m, n, k, a.gpu.data_ptr(), b.gpu.data_ptr(),
                                             tb, out.data_ptr(), pre.data_ptr(), bias.gpu.data_ptr()},
                                            nullptr))
                << at;
            // DGelu without, then with the bias gradient (its partial sums in a workspace of m / 128 rows).
            kg::sm90::GeluGemm dg{GeluEpilogue::kDGelu, m, n, k, a.gpu.data_ptr(), b.gpu.data_ptr(), tb,
                                  dout.data_ptr(), pre_in.gpu.data_ptr(), nullptr};
            ASSERT_TRUE(kg::sm90::gelu_gemm(dg, nullptr)) << at;
            cuda::synchronize_device(0);  // the direct calls ran on the default stream
            EXPECT_LE(rel_norm_error(dout, dref), 2 * matmul_tol(dt)) << at << " (direct, no dbias)";
            Tensor ws = empty({c.m / 128 * c.n}, DType::f32, kGpu);
            dout = poisoned(os, dt, kGpu);
            dg.out = dout.data_ptr();
            dg.dbias = dbias.data_ptr();
            dg.workspace = ws.data_ptr();
            dg.workspace_bytes = static_cast<size_t>(ws.numel()) * 4;
            ASSERT_TRUE(kg::sm90::applies(dg)) << at;
            dg.workspace_bytes -= 4;
            EXPECT_FALSE(kg::sm90::applies(dg)) << at << ": a workspace one float short";
            dg.workspace_bytes += 4;
            ASSERT_TRUE(kg::sm90::gelu_gemm(dg, nullptr)) << at;
            cuda::synchronize_device(0);
          } else {
            kg::matmul_bias_gelu(out, pre, a.gpu, b.gpu, false, tb, bias.gpu);
            kg::matmul_dgelu(dout, dbias, a.gpu, b.gpu, false, tb, pre_in.gpu);
          }
          const std::string how = direct ? " (direct)" : own ? " (through matmul, own)" : " (through matmul, cuBLASLt)";
          EXPECT_LE(rel_norm_error(pre, pre_ref), matmul_tol(dt)) << at << how;
          EXPECT_LE(rel_norm_error(out, ref), 2 * matmul_tol(dt)) << at << how;
          EXPECT_LE(rel_norm_error(dout, dref), 2 * matmul_tol(dt)) << at << how;
          EXPECT_LE(rel_norm_error(dbias, dbias_ref), 2 * matmul_tol(dt)) << at << how << " (bias gradient)";
        }
      }
      kg::sm90::set_enabled(true);
    }
  }
  // Shapes and pointers it does not take: m not a multiple of 256, n not a multiple of 128, k not a multiple of
  // 64, a 2-byte-aligned operand, GeluAuxBias without a bias.
  using kg::sm90::GeluEpilogue;
  void* p = reinterpret_cast<void*>(uintptr_t{4096});
  void* odd = reinterpret_cast<void*>(uintptr_t{4098});
  EXPECT_TRUE(kg::sm90::applies({GeluEpilogue::kDGelu, 256, 128, 64, p, p, true, p, p, nullptr}));
  EXPECT_FALSE(kg::sm90::applies({GeluEpilogue::kDGelu, 128, 128, 64, p, p, true, p, p, nullptr}));
  EXPECT_FALSE(kg::sm90::applies({GeluEpilogue::kDGelu, 256, 192, 64, p, p, true, p, p, nullptr}));
  EXPECT_FALSE(kg::sm90::applies({GeluEpilogue::kDGelu, 256, 128, 96, p, p, true, p, p, nullptr}));
  EXPECT_FALSE(kg::sm90::applies({GeluEpilogue::kDGelu, 256, 128, 64, odd, p, true, p, p, nullptr}));
  EXPECT_FALSE(kg::sm90::applies({GeluEpilogue::kGeluAuxBias, 256, 128, 64, p, p, true, p, p, nullptr}));
  EXPECT_FALSE(kg::sm90::applies({GeluEpilogue::kGeluAuxBias, 256, 128, 64, p, p, true, p, p, p, p, p, 1 << 20}))
      << "a bias gradient only with DGelu";
  EXPECT_FALSE(kg::sm90::applies({GeluEpilogue::kDGelu, 256, 128, 64, p, p, true, p, p, nullptr, p, nullptr, 1 << 20}))
      << "a bias gradient needs a workspace";
}

TEST(CudaMatmul, MisalignedViewsAndEmptyKStillWork) {
  INGOT_REQUIRE_CUDA();
  manual_seed(32);
  for (DType dt : {DType::bf16, DType::f32}) {
    // Operands starting one element into their buffers: 2- or 4-byte aligned pointers.
    Tensor a_cpu = random_values({1 + 1 * 31 * 24}, [](double x) { return x; }).to(dt);
    Tensor b_cpu = random_values({1 + 1 * 24 * 40}, [](double x) { return x; }).to(dt);
    Tensor a_gpu = a_cpu.to(kGpu), b_gpu = b_cpu.to(kGpu);
    auto view = [](const Tensor& t, Shape s) { return t.as_strided(s, contiguous_strides(s), 1); };
    Tensor ref = empty({1, 31, 40}, dt), out = poisoned({1, 31, 40}, dt, kGpu);
    kc::matmul(ref, view(a_cpu, {1, 31, 24}), view(b_cpu, {1, 24, 40}), false, false, 1.0, 0.0);
    kg::matmul(out, view(a_gpu, {1, 31, 24}), view(b_gpu, {1, 24, 40}), false, false, 1.0, 0.0);
    EXPECT_LE(rel_norm_error(out, ref), matmul_tol(dt)) << dtype_name(dt);
  }
  Tensor out = poisoned({2, 3, 4}, DType::f32, kGpu);
  kg::matmul(out, empty({2, 3, 0}, DType::f32, kGpu), empty({2, 0, 4}, DType::f32, kGpu), false, false, 1.0, 0.0);
  EXPECT_EQ(count_unequal(out, zeros({2, 3, 4})), 0);
}

// ---- optimizers ------------------------------------------------------------------------------------------------

// Parameters of several sizes (one spanning several chunks of the kernel, one empty) with grads of every float
// dtype; the same state on both devices.
struct OptimState {
  std::vector<Tensor> p_cpu, g_cpu, s1_cpu, s2_cpu, p_gpu, g_gpu, s1_gpu, s2_gpu;
};

OptimState make_optim_state() {
  const int64_t sizes[] = {1, 1000, 40000, 0, 777};
  const DType grad_types[] = {DType::f32, DType::bf16, DType::f16, DType::f64, DType::f32};
  OptimState s;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    const Shape sh{sizes[i]};
    Tensor p = random_values(sh, [](double x) { return x; }).to(DType::f32);
    Tensor g = random_values(sh, [](double x) { return 0.1 * x; }).to(grad_types[i]);
    Tensor m = random_values(sh, [](double x) { return 0.01 * x; }).to(DType::f32);
    Tensor v = random_values(sh, [](double x) { return 1e-3 * x * x; }).to(DType::f32);
    s.p_cpu.push_back(p);
    s.g_cpu.push_back(g);
    s.s1_cpu.push_back(m);
    s.s2_cpu.push_back(v);
    s.p_gpu.push_back(p.to(kGpu));
    s.g_gpu.push_back(g.to(kGpu));
    s.s1_gpu.push_back(m.to(kGpu));
    s.s2_gpu.push_back(v.to(kGpu));
  }
  return s;
}

void expect_equal_lists(const std::vector<Tensor>& gpu, const std::vector<Tensor>& cpu, const char* what) {
  for (size_t i = 0; i < gpu.size(); ++i) EXPECT_EQ(count_unequal(gpu[i], cpu[i]), 0) << what << " " << i;
}

// Steps 1..steps of AdamW with `args` on the CPU lists and on the GPU lists of `s`.
void adamw_steps_on_both(OptimState& s, kernels::AdamWArgs args, int64_t steps) {
  for (int64_t step = 1; step <= steps; ++step) {
    args.step = step;
    kc::adamw_multi(s.p_cpu, s.g_cpu, s.s1_cpu, s.s2_cpu, args);
    kg::adamw_multi(s.p_gpu, s.g_gpu, s.s1_gpu, s.s2_gpu, args);
  }
}

TEST(CudaOptim, AdamWUpdatesEqualCpuBitForBitOverSteps) {
  INGOT_REQUIRE_CUDA();
  manual_seed(41);
  OptimState s = make_optim_state();
  kernels::AdamWArgs args;
  args.lr = 3e-3;
  args.weight_decay = 0.1;
  args.grad_scale = 0.7;
  adamw_steps_on_both(s, args, 3);
  expect_equal_lists(s.p_gpu, s.p_cpu, "param");
  expect_equal_lists(s.s1_gpu, s.s1_cpu, "exp_avg");
  expect_equal_lists(s.s2_gpu, s.s2_cpu, "exp_avg_sq");
}

// bf16 weights without f32 masters (train.master_weights: false): the CUDA kernel rounds each update as the CPU one
// does (Note [Stochastic rounding], runtime/kernels/scalar_math.h), bit for bit, over several steps.
TEST(CudaOptim, AdamWRoundsBf16WeightsStochasticallyAsTheCpuBitForBit) {
  INGOT_REQUIRE_CUDA();
  manual_seed(42);
  OptimState s = make_optim_state();
  for (std::vector<Tensor>* list : {&s.p_cpu, &s.p_gpu})
    for (Tensor& p : *list) p = p.to(DType::bf16);
  std::vector<Tensor> start;
  for (const Tensor& p : s.p_cpu) start.push_back(p.clone_raw());
  kernels::AdamWArgs args;
  args.lr = 1e-4;  // steps of a fraction of a bf16 ulp: only the rounding moves them
  args.weight_decay = 0.1;
  adamw_steps_on_both(s, args, 3);
  expect_equal_lists(s.p_gpu, s.p_cpu, "bf16 param");
  expect_equal_lists(s.s1_gpu, s.s1_cpu, "exp_avg");
  EXPECT_GT(count_unequal(s.p_cpu[2], start[2]), 1000) << "the 40000-element weight hardly moved";
}

// Note [Optimizer tables in flight] (runtime/kernels/cuda/optim.cu): updates queue behind work the GPU has not
// reached without the host waiting for it. The stream is held by a host function that returns only when the gate
// opens; three updates must be queued before that (with one staging buffer the second update waited for the
// first one's upload, which waited for the gate: a watchdog thread opens it after 5 s so the test cannot hang).
// Once the gate opens, the updates equal the CPU's bit for bit.
TEST(CudaOptim, UpdatesQueueBehindABusyStreamWithoutTheHostWaiting) {
  INGOT_REQUIRE_CUDA();
#ifdef INGOT_WITH_CUDA
  manual_seed(43);
  OptimState s = make_optim_state();
  kernels::AdamWArgs args;
  args.lr = 1e-3;
  // First uses out of the way (what is measured is the steady state): the kernel's lazy loading and every pinned
  // staging buffer of the ring (32) allocated, on copies of the state so the comparison below is unchanged.
  {
    OptimState w = make_optim_state();
    for (int i = 0; i < 32; ++i) kg::adamw_multi(w.p_gpu, w.g_gpu, w.s1_gpu, w.s2_gpu, args);
    cuda::synchronize_stream(cuda::current_stream(kGpu.index));
  }
  std::atomic<bool> gate{false};
  const cuda::Stream stream = cuda::current_stream(kGpu.index);
  CUDA_CHECK(cudaLaunchHostFunc(
      static_cast<cudaStream_t>(stream.handle),
      [](void* g) {
        while (!static_cast<std::atomic<bool>*>(g)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      },
      &gate));
  std::thread watchdog([&gate] {
    for (int i = 0; i < 500 && !gate.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    gate.store(true);
  });
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= 3; ++step) {
    args.step = step;
    kg::adamw_multi(s.p_gpu, s.g_gpu, s.s1_gpu, s.s2_gpu, args);
  }
  const bool queued_while_held = !gate.load();
  const double host_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  gate.store(true);
  watchdog.join();
  EXPECT_TRUE(queued_while_held) << "the host waited " << host_s << " s for the GPU while queueing three updates";
  cuda::synchronize_stream(stream);
  for (int64_t step = 1; step <= 3; ++step) {
    args.step = step;
    kc::adamw_multi(s.p_cpu, s.g_cpu, s.s1_cpu, s.s2_cpu, args);
  }
  expect_equal_lists(s.p_gpu, s.p_cpu, "param");
  expect_equal_lists(s.s2_gpu, s.s2_cpu, "exp_avg_sq");
#endif
}

TEST(CudaOptim, SgdVariantsEqualCpuBitForBit) {
  INGOT_REQUIRE_CUDA();
  manual_seed(42);
  for (int variant = 0; variant < 3; ++variant) {
    OptimState s = make_optim_state();
    kernels::SgdArgs args;
    args.lr = 0.05;
    args.weight_decay = 0.01;
    args.grad_scale = 1.3;
    args.momentum = variant == 0 ? 0.0 : 0.9;
    args.dampening = variant == 1 ? 0.1 : 0.0;
    args.nesterov = variant == 2;
    for (int step = 0; step < 3; ++step) {
      args.first_step = step == 0;
      kc::sgd_multi(s.p_cpu, s.g_cpu, s.s1_cpu, args);
      kg::sgd_multi(s.p_gpu, s.g_gpu, s.s1_gpu, args);
    }
    expect_equal_lists(s.p_gpu, s.p_cpu, "param");
    if (args.momentum != 0.0) expect_equal_lists(s.s1_gpu, s.s1_cpu, "momentum");
  }
}

TEST(CudaOptim, RejectsMismatchedParameterLists) {
  INGOT_REQUIRE_CUDA();
  Tensor p = zeros({4}, DType::f32, kGpu), g = zeros({5}, DType::f32, kGpu);
  kernels::AdamWArgs args;
  EXPECT_THROW(kg::adamw_multi({p}, {g}, {p}, {p}, args), Error);
  Tensor p16 = zeros({4}, DType::bf16, kGpu);
  EXPECT_THROW(kg::sgd_multi({p16}, {p16}, {Tensor()}, kernels::SgdArgs{}), Error);
}

}  // namespace
}  // namespace ingot::testing
