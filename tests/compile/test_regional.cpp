// regional: each repeated block is compiled once. Kernels are shared by structural key in every mode (the flag
// changes nothing else), so a deeper model launches more kernels but compiles no new ones.
#include <gtest/gtest.h>

#include "compile/step_fixture.h"
#include "runtime/file_util.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

CompileStats compiled_stats(int64_t layers, const TempDir& dir) {
  models::GPT2Config cfg = tiny_gpt2_config();
  cfg.n_layer = layers;
  CompileOptions o;
  o.cache_dir = dir.path();
  o.regional = true;
  return train_steps([&] { return std::make_shared<models::GPT2>(cfg); }, true, 2, o).stats;
}

TEST(CompileRegional, RepeatedBlocksCompileOnceSoDepthAddsNoKernels) {
  TempDir dir("ingot-regional-");                     // one cache (and in-process kernel table) for both
  const CompileStats three = compiled_stats(3, dir);  // first, middle and last block
  const CompileStats six = compiled_stats(6, dir);    // four middle blocks: the same kernels again
  EXPECT_GT(three.kernels, 0) << "fused groups run as generated kernels";
  EXPECT_EQ(six.kernels_generated, 0) << "every kernel of the deeper model was compiled for the shallow one";
  EXPECT_GT(six.kernels, three.kernels) << "more blocks launch more kernels";
  EXPECT_GT(six.kernels_reused, three.kernels_reused);
  std::printf("[ regional ] 3 blocks: %lld kernels launched, %lld compiled, %lld from disk; "
              "6 blocks: %lld launched, %lld compiled\n",
              static_cast<long long>(three.kernels), static_cast<long long>(three.kernels_generated),
              static_cast<long long>(three.kernels_disk_hits), static_cast<long long>(six.kernels),
              static_cast<long long>(six.kernels_generated));
}

}  // namespace
}  // namespace ingot::testing
