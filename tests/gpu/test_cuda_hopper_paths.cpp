// Note [Hopper-only paths] (runtime/kernels/cuda/hopper.h): the kernels written for sm_90 run only where the
// device and the INGOT_HOPPER switch allow them. The GPU suites are run once as they are and once under
// INGOT_HOPPER=0 (scripts/device_dist.sh gpu1), which proves the general kernels on a Hopper; this test checks,
// in each of those runs, that the switch and the device decide and that the own wgmma product follows.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

#include "runtime/kernels/cuda/gemm_sm90.h"
#include "runtime/kernels/cuda/hopper.h"
#include "tests/testing.h"

namespace ingot {
namespace {

namespace kc = kernels::cuda;

TEST(CudaHopperPaths, FollowTheDeviceAndTheSwitch) {
  INGOT_REQUIRE_CUDA();
  const int major = kc::compute_major(0);
  const char* v = std::getenv("INGOT_HOPPER");
  const bool off = v != nullptr && std::string_view(v) == "0";
  EXPECT_EQ(kc::hopper_paths(0), !off && major >= 9) << "compute capability major " << major
                                                      << ", INGOT_HOPPER=" << (v ? v : "(unset)");
  // The own GELU product is one of those paths: never available where they are off.
  if (!kc::hopper_paths(0)) {
    EXPECT_FALSE(kc::sm90::available(0));
  }
}

}  // namespace
}  // namespace ingot
