// CUDA cross_entropy_fused against the CPU kernel of the same name and against the CUDA forward then backward, on
// fresh random inputs: GPT-2's 50304 classes (16-byte packs, 1024 threads a row) and odd class counts (the scalar
// path), ignored rows, label smoothing, i64 and i32 targets, and dlogits written over the logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/kernels/kernels.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

namespace kc = kernels::cpu;
namespace kg = kernels::cuda;

const Device kGpu = Device::cuda(0);



// Against the CPU: the two devices sum a row in different orders (50304 f32 terms one by one on the CPU), and
// a 16-bit gradient can differ by one of its own ulps.
double cpu_tol(DType t) { return t == DType::f64 ? 1e-10 : t == DType::bf16 ? 1.6e-2 : t == DType::f16 ? 2e-3 : 2e-4; }
// Against the separate CUDA kernels: the same f32 tree sums with another thread count.
double gpu_tol(DType t) { return t == DType::f64 ? 1e-12 : t == DType::bf16 ? 8e-3 : t == DType::f16 ? 1e-3 : 1e-5; }

TEST(CudaCrossEntropyFused, MatchesCpuAndTheSeparateKernelsWithIgnoredRowsAndLabelSmoothingInPlace) {
  INGOT_REQUIRE_CUDA();
  manual_seed(109);
  // 16-bit rows of a multiple of 8 take the staged kernel on sm_90 (Note [Cross-entropy rows staged in shared
  // memory]); 300 rows give each of its blocks two or three rows, through both buffers.
  const Shape shapes[] = {{40, 50304}, {7, 37}, {5, 1}, {3, 4099}, {70, 64}, {300, 4096}};
  for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
    const DType st = stat_dtype(dt);
    for (const Shape& s : shapes) {
      const int64_t rows = s[0];
      for (double ls : {0.0, 0.1}) {
        const std::string at = detail::str_cat(dtype_name(dt), " ", shape_str(s), " ls=", ls);
        SCOPED_TRACE(at);
        const Tensor x = mul(randn(s, DType::f64), 4.0).to(dt), xg = x.to(kGpu);
        const Tensor target = targets_with_ignored_rows(rows, s[1]), tg = target.to(kGpu);
        const Tensor dloss = randn({rows}, st), dlg = dloss.to(kGpu);

        Tensor loss_ref = empty({rows}, st), lse_ref = empty({rows}, st), dx_ref = empty(s, dt);
        kc::cross_entropy_fused(loss_ref, lse_ref, dx_ref, x, target, dloss, -100, ls);
        Tensor loss = poisoned({rows}, st, kGpu), lse = poisoned({rows}, st, kGpu), dx = poisoned(s, dt, kGpu);
        kg::cross_entropy_fused(loss, lse, dx, xg, tg, dlg, -100, ls);
        EXPECT_TRUE(close_at_unit_scale(loss, loss_ref, cpu_tol(st))) << "loss vs CPU";
        EXPECT_TRUE(close_at_unit_scale(lse, lse_ref, cpu_tol(st))) << "lse vs CPU";
        EXPECT_TRUE(close_at_unit_scale(dx, dx_ref, cpu_tol(dt))) << "dlogits vs CPU";

        Tensor loss_s = poisoned({rows}, st, kGpu), lse_s = poisoned({rows}, st, kGpu), dx_s = poisoned(s, dt, kGpu);
        kg::cross_entropy_fwd(loss_s, lse_s, xg, tg, -100, ls);
        kg::cross_entropy_bwd(dx_s, dlg, xg, lse_s, tg, -100, ls);
        EXPECT_TRUE(close_at_unit_scale(loss, loss_s, gpu_tol(st))) << "loss vs cross_entropy_fwd";
        EXPECT_TRUE(close_at_unit_scale(lse, lse_s, gpu_tol(st))) << "lse vs cross_entropy_fwd";
        EXPECT_TRUE(close_at_unit_scale(dx, dx_s, gpu_tol(dt))) << "dlogits vs cross_entropy_bwd";

        // Over the logits' own buffer, and with i32 targets: the same bits as above.
        Tensor buf = xg.clone_raw(), loss2 = poisoned({rows}, st, kGpu), lse2 = poisoned({rows}, st, kGpu);
        kg::cross_entropy_fused(loss2, lse2, buf, buf, tg, dlg, -100, ls);
        EXPECT_EQ(count_unequal(buf, dx), 0) << "dlogits over the logits";
        EXPECT_EQ(count_unequal(loss2, loss), 0) << "loss, in place";
        EXPECT_EQ(count_unequal(lse2, lse), 0) << "lse, in place";
        Tensor loss3 = poisoned({rows}, st, kGpu), lse3 = poisoned({rows}, st, kGpu), dx3 = poisoned(s, dt, kGpu);
        kg::cross_entropy_fused(loss3, lse3, dx3, xg, target.to(DType::i32).to(kGpu), dlg, -100, ls);
        EXPECT_EQ(count_unequal(dx3, dx), 0) << "i32 targets";
        EXPECT_EQ(count_unequal(loss3, loss), 0) << "i32 targets";
      }
    }
  }
}

}  // namespace
}  // namespace ingot::testing
