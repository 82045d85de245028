#include "../models/tiny_models.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "testing.h"

namespace ingot {
namespace {

TEST(MasterWeights, KeepsF32MastersAndBf16CopiesInSync) {
  Tensor p = testing::leaf(from_vector({1.0, -0.5, 3.0}, {3}, DType::bf16));
  optim::MasterWeights mw({p});
  ASSERT_EQ(mw.master().size(), 1u);
  const Tensor& m = mw.master()[0];
  EXPECT_EQ(m.dtype(), DType::f32);
  EXPECT_EQ(m.to_vector(), p.to_vector());
  EXPECT_TRUE(m.requires_grad());

  p.set_grad(from_vector({1.0, 1.0, -1.0}, {3}, DType::bf16));
  mw.copy_grads_to_master();
  EXPECT_TRUE(m.grad().same(p.grad()));
  // lr 1e-3: each master moves by ~1e-3, below bf16's resolution at 1.0 (2^-7), so only the master changes.
  optim::AdamW opt(mw.master(), {.lr = 1e-3, .weight_decay = 0.0});
  opt.step();
  mw.copy_to_model();
  std::vector<double> mv = m.to_vector(), pv = p.to_vector();
  EXPECT_NEAR(mv[0], 0.999, 1e-6);
  EXPECT_NEAR(mv[2], 3.001, 1e-6);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(pv[i], static_cast<double>(bf16_to_float(float_to_bf16(static_cast<float>(mv[i])))));
  EXPECT_EQ(pv[0], 1.0);
  // Ten more steps accumulate in the master until the bf16 copy moves too.
  for (int i = 0; i < 10; ++i) opt.step();
  mw.copy_to_model();
  EXPECT_LT(p.to_vector()[0], 1.0);
}

TEST(MasterWeights, MastersOfF32ParametersDoNotAliasThem) {
  Tensor p = testing::leaf(ones({2}));
  optim::MasterWeights mw({p});
  EXPECT_NE(mw.master()[0].data_ptr(), p.data_ptr());
}

TEST(MasterWeights, Bf16TinyGpt2TrainsWithF32Masters) {
  manual_seed(5);
  models::GPT2 model(testing::tiny_gpt2_config());
  model.to(DType::bf16);
  optim::MasterWeights mw(model.parameters());
  optim::AdamW opt(mw.master(), {.lr = 1e-2, .weight_decay = 0.0});
  auto [ids, tgt] = testing::repeating_batch(2, 12);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    Tensor loss = model.loss(ids, tgt);
    EXPECT_EQ(loss.dtype(), DType::f32);
    if (step == 0) first = loss.item();
    last = loss.item();
    model.zero_grad();
    loss.backward();
    mw.copy_grads_to_master();
    opt.step();
    mw.copy_to_model();
  }
  EXPECT_LT(last, 0.4 * first) << "first " << first << " last " << last;
}

}  // namespace
}  // namespace ingot
