// silu_mul's CUDA kernels (runtime/kernels/cuda/elementwise.cu) against the CPU ones: both compute silu(a) * b and
// the gradients with scalar_math.h's formulas in f32 (f64 for f64) and round once per output, but the device's
// exp is not the host's (on an H100, 128 of 1,000 f32 outputs differed in their last bits), so they agree to the
// elementwise kernels' dtype-aware tolerance (tol_for), not bit for bit. Sizes that are not a multiple of the
// block, strided forward operands, every floating dtype. Skips without a GPU.
#include <gtest/gtest.h>

#include "runtime/kernels/kernels.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

const Device kGpu = Device::cuda(0);

TEST(CudaSiluMul, ForwardAndBackwardKernelsMatchTheCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(5);
  for (DType dt : kFloatDTypes)
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{3 * 1024 * 1024 + 17}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n));
      const Tensor a = randn({n}, DType::f32, Device::cpu(), 0.0, 3.0).to(dt), b = randn({n}).to(dt),
                   dy = randn({n}).to(dt);
      Tensor out = empty({n}, dt), da = empty({n}, dt), db = empty({n}, dt);
      kernels::cpu::silu_mul_fwd(out, a, b);
      kernels::cpu::silu_mul_bwd(da, db, dy, a, b);
      const Tensor ga = a.to(kGpu), gb = b.to(kGpu), gdy = dy.to(kGpu);
      Tensor gout = empty({n}, dt, kGpu), gda = empty({n}, dt, kGpu), gdb = empty({n}, dt, kGpu);
      kernels::cuda::silu_mul_fwd(gout, ga, gb);
      kernels::cuda::silu_mul_bwd(gda, gdb, gdy, ga, gb);
      const Tol t = tol_for(dt);
      EXPECT_LE(max_rel_error(gout, out, t.rtol, t.atol), 1.0) << "forward";
      EXPECT_LE(max_rel_error(gda, da, t.rtol, t.atol), 1.0) << "gradient of a";
      EXPECT_LE(max_rel_error(gdb, db, t.rtol, t.atol), 1.0) << "gradient of b";
      // Only one gradient wanted: the other output is left alone, and the one made is the same bits.
      Tensor only_db = empty({n}, dt, kGpu);
      kernels::cuda::silu_mul_bwd(Tensor(), only_db, gdy, ga, gb);
      EXPECT_EQ(count_unequal(only_db.to(Device::cpu()), gdb.to(Device::cpu())), 0);
    }
  // The forward takes any strides (a transposed a, a broadcast b), as the elementwise kernels do.
  const Tensor a = randn({64, 48}), b = randn({48, 1});
  const Tensor at = transpose(a, 0, 1), bb = b.expand_raw({48, 64});
  Tensor out = empty({48, 64}), gout = empty({48, 64}, DType::f32, kGpu);
  kernels::cpu::silu_mul_fwd(out, at, bb);
  const Tensor ga = a.to(kGpu);
  kernels::cuda::silu_mul_fwd(gout, transpose(ga, 0, 1), b.to(kGpu).expand_raw({48, 64}));
  const Tol t = tol_for(DType::f32);
  EXPECT_LE(max_rel_error(gout, out, t.rtol, t.atol), 1.0) << "strided forward";
}

}  // namespace
}  // namespace ingot::testing
