// Note [SM carve-out] (runtime/sm_budget.h): parsing and checking the carve-out, the SMs it leaves, cuBLASLt's SM
// count target and the cache-key text derived from it. No GPU needed: the SM counts are given.
#include <gtest/gtest.h>

#include <string>

#include "runtime/error.h"
#include "runtime/sm_budget.h"
#include "testing.h"

namespace ingot {
namespace {

using ingot::testing::error_of;

TEST(SmBudget, ParsesAnIntegerAtLeastZeroAndNamesWhereABadOneCameFrom) {
  EXPECT_EQ(parse_sm_carveout("0", "INGOT_SM_CARVEOUT"), 0);
  EXPECT_EQ(parse_sm_carveout("16", "INGOT_SM_CARVEOUT"), 16);
  for (const char* bad : {"-1", "", "8x", "eight", "99999999999"}) {
    const std::string e = error_of([&] { parse_sm_carveout(bad, "INGOT_SM_CARVEOUT"); });
    EXPECT_NE(e.find(std::string("INGOT_SM_CARVEOUT='") + bad + "': expected an SM carve-out, an integer >= 0"),
              std::string::npos)
        << "'" << bad << "': " << e;
  }
  const std::string negative = error_of([] { set_sm_carveout(-2, "--sm-carveout"); });
  EXPECT_NE(negative.find("--sm-carveout=-2: expected an SM carve-out >= 0"), std::string::npos) << negative;
}

TEST(SmBudget, KernelsPlanForTheSmsLeftAndACarveOutLeavingNoneIsAnErrorNamingItsKey) {
  {
    SmCarveoutScope off(0, "--sm-carveout");
    EXPECT_EQ(sm_carveout(), 0);
    EXPECT_EQ(sms_left(132), 132);
    EXPECT_EQ(sm_carveout_source(), "") << "no carve-out, nothing to name";
  }
  SmCarveoutScope eight(8, "distributed.sm_carveout");
  EXPECT_EQ(sm_carveout(), 8);
  EXPECT_EQ(sm_carveout_source(), "distributed.sm_carveout");
  EXPECT_EQ(sms_left(132), 124);
  EXPECT_EQ(sms_left(9), 1);
  for (int total : {8, 4}) {
    const std::string e = error_of([&] { sms_left(total); });
    EXPECT_NE(e.find("distributed.sm_carveout=8: an SM carve-out must leave SMs to compute on, but this GPU has " +
                     std::to_string(total) + " (expected 0 <= carve-out < " + std::to_string(total) + ")"),
              std::string::npos)
        << e;
  }
}

// The descriptor attribute is set only with a carve-out (0 leaves cuBLASLt to the device's count), and plans
// tuned for one SM budget are keyed apart from another's.
TEST(SmBudget, CountTargetAndCacheKeysFollowTheCarveOut) {
  std::string key_off, key_8, key_16;
  {
    SmCarveoutScope off(0, "--sm-carveout");
    EXPECT_EQ(sm_count_target(132), 0);
    key_off = sm_budget_key(132);
  }
  {
    SmCarveoutScope eight(8, "--sm-carveout");
    EXPECT_EQ(sm_count_target(132), 124);
    key_8 = sm_budget_key(132);
  }
  {
    SmCarveoutScope sixteen(16, "--sm-carveout");
    EXPECT_EQ(sm_count_target(132), 116);
    key_16 = sm_budget_key(132);
  }
  EXPECT_EQ(key_off, "") << "keys without a carve-out stay as they were (existing caches keep matching)";
  EXPECT_EQ(key_8, " sm_target 124");
  EXPECT_EQ(key_16, " sm_target 116");
}

TEST(SmBudget, AScopeRestoresTheCarveOutAndItsSourceBeforeIt) {
  SmCarveoutScope outer(4, "INGOT_SM_CARVEOUT");
  {
    SmCarveoutScope inner(12, "--sm-carveout");
    EXPECT_EQ(sm_carveout(), 12);
    EXPECT_EQ(sm_carveout_source(), "--sm-carveout");
  }
  EXPECT_EQ(sm_carveout(), 4);
  EXPECT_EQ(sm_carveout_source(), "INGOT_SM_CARVEOUT");
}

}  // namespace
}  // namespace ingot
