// BatchPrefetcher (recipes/prefetch.h): batches put on the host come back on the device with their values,
// in order, while earlier batches stay intact until the put after next; on the CPU it hands tensors through.
#include <gtest/gtest.h>

#include <vector>

#include "recipes/prefetch.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

std::vector<Tensor> host_batch(int64_t rows, int64_t seed) {
  manual_seed(static_cast<uint64_t>(seed));
  return {randint(0, 50000, {rows, 33}), randn({rows}, DType::f32)};
}

void expect_equal(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].shape(), want[i].shape()) << what << " tensor " << i;
    EXPECT_EQ(got[i].to(Device::cpu()).to_vector(), want[i].to_vector()) << what << " tensor " << i;
  }
}

void run_batches(Device dev) {
  recipes::BatchPrefetcher pf(dev);
  EXPECT_FALSE(pf.pending());
  std::vector<std::vector<Tensor>> hosts;
  std::vector<Tensor> previous;
  std::vector<Tensor> previous_values;
  for (int64_t k = 0; k < 7; ++k) {
    // A shape change at step 4 reallocates the slot's buffers.
    hosts.push_back(host_batch(k < 4 ? 8 : 5, 100 + k));
    pf.put(hosts.back());
    EXPECT_TRUE(pf.pending());
    // Work on the previous batch queued after the put: it must still read the previous values.
    if (!previous.empty()) {
      Tensor sum_prev = mul(previous[1], 2.0);
      EXPECT_EQ(sum_prev.to(Device::cpu()).to_vector(), mul(previous_values[1], 2.0).to_vector()) << "step " << k;
    }
    std::vector<Tensor> got = pf.take();
    EXPECT_FALSE(pf.pending());
    for (const Tensor& t : got) EXPECT_EQ(t.device(), dev);
    expect_equal(got, hosts.back(), "batch " + std::to_string(k));
    previous = got;
    previous_values = hosts.back();
  }
  EXPECT_THROW(pf.take(), Error);
}

TEST(BatchPrefetcher, HandsCpuBatchesThrough) { run_batches(Device::cpu()); }

TEST(BatchPrefetcher, CopiesBatchesToTheGpuInOrderWithoutOverwritingTheOneInUse) {
  INGOT_REQUIRE_CUDA();
  run_batches(Device::cuda(0));
}

TEST(BatchPrefetcher, RejectsTwoPutsWithoutATake) {
  recipes::BatchPrefetcher pf(Device::cpu());
  pf.put(host_batch(2, 1));
  EXPECT_THROW(pf.put(host_batch(2, 2)), Error);
}

}  // namespace
}  // namespace ingot::testing
