// cross_entropy_fused (autograd/ops/loss_fused.h, runtime/kernels/cpu/loss.cpp): the CPU kernel gives exactly
// what cross_entropy_fwd then cross_entropy_bwd give, with ignored rows and label smoothing, also when dlogits
// is written over the logits; the primitive puts the executor's reused buffer at output 2.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/ops/loss_fused.h"
#include "runtime/kernels/kernels.h"
#include "testing.h"

namespace ingot {
namespace {

namespace kc = kernels::cpu;

DType stat_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

// Random targets in [0, classes) with every fourth row set to `ignore`.
Tensor targets_with_ignored(int64_t rows, int64_t classes, int64_t ignore) {
  std::vector<int64_t> t;
  for (double v : randint(0, classes, {rows}).to_vector()) t.push_back(static_cast<int64_t>(v));
  for (int64_t r = 1; r < rows; r += 4) t[static_cast<size_t>(r)] = ignore;
  return from_vector_i64(t, {rows});
}

void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  EXPECT_EQ(got.to_vector(), want.to_vector()) << what;
}

TEST(CrossEntropyFused, CpuKernelEqualsForwardThenBackwardWithIgnoredRowsAndLabelSmoothing) {
  manual_seed(41);
  // The second shape is large enough for the rows to be split over threads.
  const Shape shapes[] = {{9, 37}, {40, 3001}};
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    const DType st = stat_dtype(dt);
    for (const Shape& s : shapes) {
      // -100 is PyTorch's default; 5 is a valid class used as ignore_index.
      for (int64_t ignore : {int64_t{-100}, int64_t{5}}) {
        for (double ls : {0.0, 0.1}) {
          const std::string at = std::string(dtype_name(dt)) + " " + shape_str(s) + " ignore_index " +
                                 std::to_string(ignore) + " label_smoothing " + std::to_string(ls);
          SCOPED_TRACE(at);
          const int64_t rows = s[0];
          Tensor x = mul(randn(s, DType::f64), 3.0).to(dt), t = targets_with_ignored(rows, s[1], ignore);
          Tensor dloss = randn({rows}, st);
          Tensor loss_ref = empty({rows}, st), lse_ref = empty({rows}, st), dx_ref = empty(s, dt);
          kc::cross_entropy_fwd(loss_ref, lse_ref, x, t, ignore, ls);
          kc::cross_entropy_bwd(dx_ref, dloss, x, lse_ref, t, ignore, ls);

          Tensor loss = empty({rows}, st), lse = empty({rows}, st), dx = empty(s, dt);
          kc::cross_entropy_fused(loss, lse, dx, x, t, dloss, ignore, ls);
          expect_same(loss, loss_ref, "loss");
          expect_same(lse, lse_ref, "lse");
          expect_same(dx, dx_ref, "dlogits");

          Tensor buf = x.clone_raw(), loss2 = empty({rows}, st), lse2 = empty({rows}, st);
          kc::cross_entropy_fused(loss2, lse2, buf, buf, t, dloss, ignore, ls);
          expect_same(loss2, loss_ref, "loss, in place");
          expect_same(lse2, lse_ref, "lse, in place");
          expect_same(buf, dx_ref, "dlogits over the logits");
        }
      }
    }
  }
}

TEST(CrossEntropyFused, PrimitiveWritesTheGradientIntoTheBufferItIsGiven) {
  manual_seed(42);
  const int64_t rows = 6, classes = 11;
  std::shared_ptr<Primitive> p = make_cross_entropy_fused(-100, 0.1);
  EXPECT_EQ(p->name(), "cross_entropy_fused");
  ASSERT_EQ(p->reusable_input(), std::optional<size_t>(0));
  Tensor x = randn({rows, classes}), t = targets_with_ignored(rows, classes, -100), dloss = randn({rows});
  const std::vector<Tensor> fresh = p->eval({x, t, dloss});
  ASSERT_EQ(fresh.size(), 3u);
  Tensor buf = x.clone_raw();
  const std::vector<Tensor> reused = p->eval_into({buf, t, dloss}, buf);
  ASSERT_EQ(reused.size(), 3u);
  EXPECT_EQ(reused[2].data_ptr(), buf.data_ptr()) << "dlogits is output 2, in the given buffer";
  for (size_t k = 0; k < 3; ++k) expect_same(reused[k], fresh[k], "output " + std::to_string(k));
  Tensor loss_ref = empty({rows}), lse_ref = empty({rows}), dx_ref = empty({rows, classes});
  kc::cross_entropy_fwd(loss_ref, lse_ref, x, t, -100, 0.1);
  kc::cross_entropy_bwd(dx_ref, dloss, x, lse_ref, t, -100, 0.1);
  expect_same(fresh[0], loss_ref, "loss");
  expect_same(fresh[1], lse_ref, "lse");
  expect_same(fresh[2], dx_ref, "dlogits");
}

TEST(CrossEntropyFused, RejectsADlossOfTheWrongDtype) {
  std::shared_ptr<Primitive> p = make_cross_entropy_fused(-100, 0.0);
  const std::string msg = testing::error_of([&] {
    p->infer(
        {{{4, 3}, DType::bf16, Device::cpu()}, {{4}, DType::i64, Device::cpu()}, {{4}, DType::bf16, Device::cpu()}});
  });
  EXPECT_NE(msg.find("cross_entropy_fused: expected dloss f32[4], got bf16[4]"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ingot
