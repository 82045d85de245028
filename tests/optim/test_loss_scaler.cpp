#include <cmath>

#include "optim/loss_scaler.h"
#include "testing.h"

namespace ingot {
namespace {

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterAnIntervalOfFiniteSteps) {
  optim::LossScaler s({.init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.update(false));  // skipped; 1024 * 0.5
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.growth_tracker(), 2);
  EXPECT_TRUE(s.update(true));  // the third finite step in a row: 512 * 2, tracker restarts
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));  // an overflow restarts the count
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.growth_tracker(), 0);
  s.restore(4096, 2);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 8192);
  EXPECT_THROW(s.restore(0, 0), Error);
  EXPECT_THROW(optim::LossScaler({.backoff_factor = 1.5}), Error);
}

}  // namespace
}  // namespace ingot
