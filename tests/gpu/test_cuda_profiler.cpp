// Note [Ops timed on the device] (recipes/profile.h): the op profiler's device timing records CUDA events around
// every op and synchronizes nothing while the step runs. With the stream held for 200 ms before the ops (a host
// callback the stream waits behind), the host queues them all and reaches the end of the step long before the
// GPU runs them, which a synchronizing profiler cannot do; once the step's events are read, the five large
// products take more of the device time than the small add, and a reshape that only views times 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "autograd/ops.h"
#include "recipes/profile.h"
#include "runtime/cuda_runtime.h"
#include "tests/testing.h"

namespace ingot {
namespace {

TEST(CudaOpProfiler, DeviceTimingQueuesTheStepWithoutWaitingAndTimesEachOpOnTheStream) {
  INGOT_REQUIRE_CUDA();
  const Device gpu(DeviceType::cuda, 0);
  manual_seed(3);
  const Tensor a = randn({2048, 2048}).to(gpu), b = randn({2048, 2048}).to(gpu), small = randn({64}).to(gpu);
  // cuBLAS's handle and workspace, and the kernels' first loads, before the profiled step: they may synchronize.
  (void)matmul(a, b);
  (void)add(small, 1.0);
  cuda::synchronize_device(0);
  recipes::OpProfiler prof(0);
  prof.start(1);
  const auto t0 = std::chrono::steady_clock::now();
  cuda::hold_stream(cuda::current_stream(0), 200.0);
  Tensor c = matmul(a, b);
  for (int i = 0; i < 4; ++i) c = matmul(c, b);
  Tensor d = add(small, 1.0);
  // Views launch nothing and time 0 (no end event of their own); a reshape that must copy (of a transposed
  // tensor) launched a kernel and is timed.
  Tensor v = reshape(c, {2048 * 2048});
  Tensor copied = reshape(transpose(c, 0, 1), {2048 * 2048});
  const double queued_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  prof.stop();  // reads the events: waits for the GPU
  EXPECT_LT(queued_ms, 150.0) << "the profiled ops waited for the GPU";
  double products = 0, others = 0;
  int product_ops = 0;
  for (const auto& e : prof.events()) {
    EXPECT_GE(e.dur_us, 0.0) << e.name;
    const bool product = e.name.find("matmul") != std::string::npos;
    product_ops += product;
    // A 2048^3 f32 product takes well over 50 us on any GPU this runs on; its launch on the host ~10 us: a
    // duration read from the host clock around an unsynchronized launch would fall below.
    if (product) {
      EXPECT_GT(e.dur_us, 50.0) << e.name;
    }
    (product ? products : others) += e.dur_us;
  }
  EXPECT_GE(product_ops, 5);
  int reshapes = 0;
  double reshape_us[2] = {-1, -1};
  for (const auto& e : prof.events())
    if (e.name == "reshape" && reshapes < 2) reshape_us[reshapes++] = e.dur_us;
  ASSERT_EQ(reshapes, 2);
  EXPECT_EQ(reshape_us[0], 0.0) << "a reshape that viewed its input";
  EXPECT_GT(reshape_us[1], 5.0) << "a reshape that copied 16 MB";
  EXPECT_GT(products, 0.0);
  EXPECT_GT(products, others) << "five 2048^3 products against one small add";
  const std::string table = prof.top_ops_table(5);
  EXPECT_NE(table.find("timed on the device"), std::string::npos) << table;
  (void)d;
  (void)v;
  (void)copied;
}

}  // namespace
}  // namespace ingot
