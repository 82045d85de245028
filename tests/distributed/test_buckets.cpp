// Bucket planning (shared by eager DDP and the compiled step) and the overlap it buys: buckets are reduced
// while backward is still running.
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "distributed/buckets.h"
#include "distributed/ddp.h"
#include "runtime/rng.h"

namespace ingot::distributed {
namespace {

TEST(PlanBuckets, PacksInReverseOrderClosesAtTheCapSplitsOnDtypeAndPadsForZeroOne) {
  // Registration order 0..4; 4 bytes per f32, 8 per f64.
  std::vector<BucketParam> ps = {{10, DType::f32}, {20, DType::f32}, {3, DType::f64}, {7, DType::f32}, {5, DType::f32}};
  auto plans = plan_buckets(ps, 100.0, 4);
  ASSERT_EQ(plans.size(), 3u);
  // 4 (20 B) then 3 (48 B); 2 is f64: a new bucket; 1 (f32 again) opens another, 80 B < 100, so 0 joins it.
  EXPECT_EQ(plans[0].params, (std::vector<size_t>{4, 3}));
  EXPECT_EQ(plans[0].offsets, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(plans[0].numel, 12);
  EXPECT_EQ(plans[0].padded_numel, 12);
  EXPECT_EQ(plans[1].params, (std::vector<size_t>{2}));
  EXPECT_EQ(plans[1].dtype, DType::f64);
  EXPECT_EQ(plans[1].padded_numel, 4);
  EXPECT_EQ(plans[2].params, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(plans[2].numel, 30);
  EXPECT_EQ(plans[2].padded_numel, 32);
  // Once a bucket holds the cap, the next parameter starts a new one.
  EXPECT_EQ(plan_buckets(ps, 80.0).size(), 4u);
}

TEST(PlanBuckets, ABadCapOrPaddingIsRejected) {
  try {
    plan_buckets({{4, DType::f32}}, 0.0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bucket cap must be > 0 bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan_buckets({{4, DType::f32}}, 10.0, 0), Error);
}

TEST(PlanBuckets, DdpIssuesEarlierBucketsWhileBackwardIsStillRunning) {
  auto server = std::make_shared<TcpStoreServer>(0, "127.0.0.1");
  ProcessGroupOptions o;
  o.hostname = "127.0.0.1";
  auto group = new_gloo_group(std::make_shared<TcpStore>("127.0.0.1", server->port()), 0, 1, o);
  manual_seed(3);
  auto leaf = [](Tensor t) {
    t = t.detach();
    t.set_requires_grad(true);
    return t;
  };
  // Forward uses a, then b, then c: backward produces c's gradient first and a's last.
  Tensor a = leaf(randn({4})), b = leaf(randn({4})), c = leaf(randn({4})), x = randn({4});
  DdpOptions opt;
  opt.bucket_cap_mb = 1e-6;  // one parameter per bucket
  DistributedDataParallel ddp({a, b, c}, group, opt);
  ASSERT_EQ(ddp.bucket_layout(), (std::vector<std::vector<size_t>>{{2}, {1}, {0}}));
  int64_t start = group->next_seq(), seen_when_a_arrives = -1;
  a.register_hook([&](const Tensor&) {
    seen_when_a_arrives = group->next_seq();
    return Tensor();
  });
  sum(mul(c, tanh(mul(b, tanh(mul(a, x)))))).backward();
  // c's and b's buckets were issued before a's gradient even existed.
  EXPECT_EQ(seen_when_a_arrives, start + 2);
  EXPECT_EQ(group->next_seq(), start + 3);
  ddp.synchronize();
}

}  // namespace
}  // namespace ingot::distributed
