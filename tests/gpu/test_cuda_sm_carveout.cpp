// Note [SM carve-out] (runtime/sm_budget.h) on the GPU: cuBLASLt's descriptors get the SM count target only with
// a carve-out, products computed under one equal those computed without (cuBLASLt may pick another kernel for
// fewer SMs: equal to rounding; the own Hopper GELU product only runs fewer CTAs: bit-equal), tuned plans are
// keyed by the SMs left, and a carve-out that leaves no SMs is refused naming where it came from.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "runtime/cuda_runtime.h"
#include "runtime/kernels/cuda/gemm_sm90.h"
#include "runtime/kernels/kernels.h"
#include "runtime/sm_budget.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/testing.h"

#ifdef INGOT_WITH_CUDA
#include "runtime/kernels/cuda/matmul_tuning.h"
#endif
#ifdef INGOT_WITH_CUDA_CODEGEN
#include "compile/autotune/cuda/tuner.h"
#endif

namespace ingot::testing {
namespace {

namespace kg = kernels::cuda;

const Device kGpu = Device::cuda(0);

// Building a descriptor needs cuBLASLt, not a GPU.
TEST(CudaSmCarveout, MatmulDescriptorsTargetTheSmsLeftOnlyWithACarveOut) {
#ifdef INGOT_WITH_CUDA
  {
    SmCarveoutScope off(0, "--sm-carveout");
    EXPECT_EQ(kg::matmul_desc_sm_count_target(132), 0) << "without a carve-out the attribute stays unset";
  }
  SmCarveoutScope eight(8, "--sm-carveout");
  EXPECT_EQ(kg::matmul_desc_sm_count_target(132), 124);
  EXPECT_EQ(kg::matmul_desc_sm_count_target(114), 106);
#else
  GTEST_SKIP() << "built without CUDA: no cuBLASLt descriptors";
#endif
}

// Every product of a GPT-2 step's shapes (16K rows of 768, the MLP's 3072) under carve-outs of 8 SMs and of half
// the GPU, against the same product without one.
TEST(CudaSmCarveout, ProductsEqualThoseWithoutACarveOut) {
  INGOT_REQUIRE_CUDA();
  manual_seed(47);
  const int total = cuda::multiprocessor_count(0);
  const int64_t m = 2048, n = 3072, k = 768;
  for (DType dt : {DType::f32, DType::bf16}) {
    Operand a = make_operand({1, m, k}, dt, Layout::Contiguous);
    Operand b = make_operand({1, n, k}, dt, Layout::Contiguous);
    const double tol = dt == DType::f32 ? 1e-5 : 1e-2;  // another kernel: another summation order
    auto product = [&] {
      Tensor out = poisoned({1, m, n}, dt, kGpu);
      kg::matmul(out, a.gpu, b.gpu, false, true, 1.0, 0.0);
      return out.to(Device::cpu());
    };
    Tensor ref;
    {
      SmCarveoutScope off(0, "--sm-carveout");
      ref = product();
    }
    for (int carveout : {8, total / 2}) {
      SmCarveoutScope scope(carveout, "--sm-carveout");
      EXPECT_LE(rel_norm_error(product(), ref), tol) << dtype_name(dt) << ", carve-out " << carveout;
    }
  }
}

// The own GELU products keep their tiles and only run fewer CTAs over them: the same bits (bias gradient too).
TEST(CudaSmCarveout, OwnHopperGeluProductsAreBitEqualUnderACarveOut) {
  INGOT_REQUIRE_CUDA();
  if (!kg::sm90::available(0)) GTEST_SKIP() << "needs a compute capability 9.0 GPU and an sm_90a build";
  manual_seed(48);
  const int total = cuda::multiprocessor_count(0);
  const int64_t m = 4096, n = 3072, k = 768;
  const DType dt = DType::bf16;
  Operand a = make_operand({1, m, k}, dt, Layout::Contiguous);
  Operand b = make_operand({1, n, k}, dt, Layout::Contiguous);
  Operand bias = make_operand({n}, dt, Layout::Contiguous);
  Operand pre_in = make_operand({m, n}, dt, Layout::Contiguous, [](double x) { return 3 * x; });
  auto run = [&] {
    Tensor out = poisoned({1, m, n}, dt, kGpu), pre = poisoned({1, m, n}, dt, kGpu);
    Tensor dout = poisoned({1, m, n}, dt, kGpu), dbias = poisoned({n}, dt, kGpu);
    kg::matmul_bias_gelu(out, pre, a.gpu, b.gpu, false, true, bias.gpu);
    kg::matmul_dgelu(dout, dbias, a.gpu, b.gpu, false, true, pre_in.gpu);
    std::vector<Tensor> host;
    for (const Tensor& t : {out, pre, dout, dbias}) host.push_back(t.to(Device::cpu()));
    return host;
  };
  std::vector<Tensor> ref;
  {
    SmCarveoutScope off(0, "--sm-carveout");
    ref = run();
  }
  for (int carveout : {8, total / 2}) {
    SmCarveoutScope scope(carveout, "--sm-carveout");
    const std::vector<Tensor> got = run();
    const char* names[] = {"gelu(pre)", "pre", "dgelu product", "bias gradient"};
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(count_unequal(got[i], ref[i]), 0) << names[i] << ", carve-out " << carveout;
  }
}

#ifdef INGOT_WITH_CUDA
// Records the signatures max-autotune would look up, and answers "first heuristic" so nothing is timed.
struct SignatureRecorder : kg::MatmulTuner {
  std::vector<std::string> seen;
  std::optional<std::string> find(const std::string& signature) override {
    seen.push_back(signature);
    return std::string();
  }
  bool may_time() override { return false; }
  void chose(const std::string&, const std::string&, double, double, int) override {}
};
#endif

TEST(CudaSmCarveout, TunedPlansAreKeyedByTheSmsLeft) {
  INGOT_REQUIRE_CUDA();
#ifdef INGOT_WITH_CUDA
  const int total = cuda::multiprocessor_count(0);
  Operand a = make_operand({1, 256, 128}, DType::bf16, Layout::Contiguous);
  Operand b = make_operand({1, 128, 192}, DType::bf16, Layout::Contiguous);
  Tensor out = empty({1, 256, 192}, DType::bf16, kGpu);
  SignatureRecorder tuner;
  {
    kg::MatmulTuningScope scope(&tuner);
    SmCarveoutScope off(0, "--sm-carveout");
    kg::matmul(out, a.gpu, b.gpu, false, false, 1.0, 0.0);
    SmCarveoutScope eight(8, "--sm-carveout");
    kg::matmul(out, a.gpu, b.gpu, false, false, 1.0, 0.0);
  }
  ASSERT_EQ(tuner.seen.size(), 2u);
  EXPECT_EQ(tuner.seen[0].find("sm_target"), std::string::npos) << tuner.seen[0];
  const std::string suffix = " sm_target " + std::to_string(total - 8);
  EXPECT_TRUE(tuner.seen[1].size() > suffix.size() &&
              tuner.seen[1].compare(tuner.seen[1].size() - suffix.size(), suffix.size(), suffix) == 0)
      << tuner.seen[1];
#endif
#ifdef INGOT_WITH_CUDA_CODEGEN
  std::string plain, carved;
  {
    SmCarveoutScope off(0, "--sm-carveout");
    plain = autotune::cuda_device_id(0);
  }
  {
    SmCarveoutScope eight(8, "--sm-carveout");
    carved = autotune::cuda_device_id(0);
  }
  EXPECT_EQ(carved, plain + " sm_target " + std::to_string(total - 8)) << "the autotune database's device id";
#endif
}

TEST(CudaSmCarveout, ACarveOutLeavingNoSmsIsRefusedNamingItsSource) {
  INGOT_REQUIRE_CUDA();
  const int total = cuda::multiprocessor_count(0);
  SmCarveoutScope all(total, "distributed.sm_carveout");
  try {
    usable_sms(0);
    ADD_FAILURE() << "a carve-out of every SM was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("distributed.sm_carveout=" + std::to_string(total) +
                                         ": an SM carve-out must leave SMs to compute on"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ingot::testing
