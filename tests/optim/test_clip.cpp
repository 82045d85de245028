#include "optim/clip.h"
#include "optim/optimizer.h"
#include "testing.h"

namespace ingot {
namespace {

TEST(ClipGradNorm, ReturnsTheGlobalNormAndScalesAllGrads) {
  Tensor a = testing::leaf(zeros({2})), b = testing::leaf(zeros({1, 1})), c = testing::leaf(zeros({3}));
  a.set_grad(from_vector({3, 4}, {2}));
  b.set_grad(from_vector({12}, {1, 1}));
  // c has no grad and is ignored.
  EXPECT_NEAR(optim::grad_norm({a, b, c}), 13.0, 1e-5);
  double norm = optim::clip_grad_norm({a, b, c}, 6.5);
  EXPECT_NEAR(norm, 13.0, 1e-5);
  EXPECT_LE(max_rel_error(a.grad(), from_vector({1.5, 2.0}, {2}), 1e-5, 1e-6), 1.0);
  EXPECT_LE(max_rel_error(b.grad(), from_vector({6.0}, {1, 1}), 1e-5, 1e-6), 1.0);
  EXPECT_NEAR(optim::grad_norm({a, b}), 6.5, 1e-4);
}

TEST(ClipGradNorm, LeavesSmallGradsAlone) {
  Tensor a = testing::leaf(zeros({2}));
  a.set_grad(from_vector({0.3, 0.4}, {2}));
  EXPECT_NEAR(optim::clip_grad_norm({a}, 1.0), 0.5, 1e-6);
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{static_cast<float>(0.3), static_cast<float>(0.4)}));
  EXPECT_EQ(optim::clip_grad_norm({}, 1.0), 0.0);
  EXPECT_THROW(optim::clip_grad_norm({a}, 0.0), Error);
}

TEST(ClipGradNorm, FusedScaleGivesTheSameUpdateAsInPlaceClipping) {
  manual_seed(2);
  Tensor init = randn({5}), g = randn({5});
  Tensor p1 = testing::leaf(init.clone_raw()), p2 = testing::leaf(init.clone_raw());
  p1.set_grad(mul(g, 10.0).contiguous_raw());
  p2.set_grad(mul(g, 10.0).contiguous_raw());
  optim::SGD o1({p1}, {.lr = 0.1}), o2({p2}, {.lr = 0.1});
  optim::clip_grad_norm({p1}, 1.0);
  o1.step();
  o2.set_grad_scale(optim::clip_coefficient(optim::grad_norm({p2}), 1.0));
  o2.step();
  EXPECT_LE(max_rel_error(p1, p2, 1e-6, 1e-7), 1.0);
}

}  // namespace
}  // namespace ingot
