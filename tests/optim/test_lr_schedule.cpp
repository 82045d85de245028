#include <cmath>
#include <numbers>

#include "optim/lr_schedule.h"
#include "testing.h"

namespace ingot {
namespace {

using optim::LrSchedule;

TEST(LrSchedule, WarmupRampsLinearlyToBaseLr) {
  LrSchedule s{LrSchedule::Kind::Cosine, 1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
}

TEST(LrSchedule, CosineDecaysToMinLrAndStaysThere) {
  LrSchedule s{LrSchedule::Kind::Cosine, 1.0, 0.1, 10, 110};
  EXPECT_NEAR(s.at(35), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi / 4)), 1e-12);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);
}

TEST(LrSchedule, LinearDecaysToMinLr) {
  LrSchedule s{LrSchedule::Kind::Linear, 1.0, 0.1, 10, 110};
  EXPECT_NEAR(s.at(35), 0.775, 1e-12);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
}

TEST(LrSchedule, ConstantHoldsBaseLrAfterWarmup) {
  LrSchedule s{LrSchedule::Kind::Constant, 3e-4, 0.0, 4, 0};
  EXPECT_DOUBLE_EQ(s.at(1), 1.5e-4);
  EXPECT_DOUBLE_EQ(s.at(4), 3e-4);
  EXPECT_DOUBLE_EQ(s.at(1000000), 3e-4);
  LrSchedule none;
  EXPECT_DOUBLE_EQ(none.at(0), none.base_lr);
}

TEST(LrSchedule, ParsesKindsAndRejectsUnknownOnes) {
  EXPECT_EQ(LrSchedule::parse_kind("cosine"), LrSchedule::Kind::Cosine);
  EXPECT_EQ(LrSchedule::parse_kind("linear"), LrSchedule::Kind::Linear);
  EXPECT_EQ(LrSchedule::parse_kind("constant"), LrSchedule::Kind::Constant);
  try {
    LrSchedule::parse_kind("cosin");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cosin"), std::string::npos);
  }
}

}  // namespace
}  // namespace ingot
