// DistributedDataParallel over Gloo with 2-4 real processes, each checked against a single-process run of the
// whole global batch computed in the same process: gradients, accumulation, ZeRO-1 and world-size independence.
#include <gtest/gtest.h>

#include <chrono>

#include "autograd/nn/layers.h"
#include "autograd/nn/module.h"
#include "autograd/ops.h"
#include "distributed/bootstrap.h"
#include "distributed/ddp.h"
#include "distributed/sampler.h"
#include "distributed/spawn.h"
#include "optim/optimizer.h"
#include "runtime/rng.h"
#include "tests/testing.h"

namespace ingot::distributed {
namespace {

using namespace std::chrono_literals;
using ingot::testing::expect_ranks_pass;
using ingot::testing::is_rank_process;
using ingot::testing::spawn_ranks;

using ingot::testing::error_of;

Tensor leaf(Tensor t) {
  t = t.detach();
  t.set_requires_grad(true);
  return t;
}

// A two-layer tanh MLP, 8 -> 16 -> 4, with an MSE loss.
struct Mlp {
  Tensor w1, b1, w2, b2;
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }
};

Mlp make_mlp(uint64_t seed, DType dt) {
  manual_seed(seed);
  return {leaf(randn({8, 16}, dt) * 0.4), leaf(randn({16}, dt) * 0.1), leaf(randn({16, 4}, dt) * 0.4),
          leaf(randn({4}, dt) * 0.1)};
}

Tensor mlp_loss(const Mlp& m, const Tensor& x, const Tensor& y) {
  Tensor h = tanh(add(matmul(x, m.w1), m.b1));
  return mse_loss(add(matmul(h, m.w2), m.b2), y);
}

struct Data {
  Tensor x, y;
};

Data global_data(int64_t n, DType dt) {
  manual_seed(7);
  Tensor x = randn({n, 8}, dt);
  Tensor y = randn({n, 4}, dt);
  return {x, y};
}

Tensor rows(const Tensor& t, const std::vector<int64_t>& idx) { return index_select(t, 0, from_vector_i64(idx, {static_cast<int64_t>(idx.size())})); }

std::vector<int64_t> range(int64_t b, int64_t e) {
  std::vector<int64_t> v;
  for (int64_t i = b; i < e; ++i) v.push_back(i);
  return v;
}

InitOptions quick_init() { return ingot::testing::gloo_test_init(); }

// A one-rank Gloo group inside the test process, for layout and error tests.
struct LocalGroup {
  std::shared_ptr<TcpStoreServer> server = std::make_shared<TcpStoreServer>(0, "127.0.0.1");
  std::shared_ptr<ProcessGroup> group;
  LocalGroup() {
    ProcessGroupOptions o;
    o.hostname = "127.0.0.1";
    group = new_gloo_group(std::make_shared<TcpStore>("127.0.0.1", server->port()), 0, 1, o);
  }
};

void expect_grads_close(const Mlp& a, const Mlp& b, double rtol, double atol) {
  auto pa = a.params(), pb = b.params();
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pa[i].grad().defined() && pb[i].grad().defined()) << "param " << i;
    EXPECT_LE(max_rel_error(pa[i].grad(), pb[i].grad(), rtol, atol), 1.0)
        << "param " << i << ": " << pa[i].grad().str() << " vs " << pb[i].grad().str();
  }
}

TEST(DistributedDataParallel, GradientsEqualTheSingleProcessGradientsOfTheFullBatch) {
  if (is_rank_process()) {
    auto ctx = init_distributed(quick_init());
    const int rank = ctx.info.rank, world = ctx.info.world_size;
    Mlp ref = make_mlp(100, DType::f64);
    Mlp m = make_mlp(100 + rank, DType::f64);  // every rank starts elsewhere: DDP must broadcast rank 0's
    DdpOptions opt;
    opt.bucket_cap_mb = 600.0 / (1 << 20);  // 600 bytes: several buckets
    DistributedDataParallel ddp(m.params(), ctx.group, opt);
    EXPECT_GE(ddp.bucket_layout().size(), 2u);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(max_rel_error(m.params()[i], ref.params()[i], 0, 0), 0) << i;
    Data d = global_data(16, DType::f64);
    RowRange r = batch_shard(16, rank, world);
    mlp_loss(m, rows(d.x, range(r.begin, r.end)), rows(d.y, range(r.begin, r.end))).backward();
    ddp.synchronize();
    mlp_loss(ref, d.x, d.y).backward();
    expect_grads_close(m, ref, 1e-10, 1e-13);
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(4)));
}

TEST(DistributedDataParallel, AccumulationThatCommunicatesOnlyOnTheLastMicroStepEqualsALargerBatch) {
  if (is_rank_process()) {
    auto ctx = init_distributed(quick_init());
    const int rank = ctx.info.rank, world = ctx.info.world_size;
    Mlp ref = make_mlp(100, DType::f64), m = make_mlp(100, DType::f64);
    DistributedDataParallel ddp(m.params(), ctx.group);
    Data d = global_data(16, DType::f64);
    RowRange r = batch_shard(16, rank, world);
    int64_t half = r.size() / 2;
    int64_t seq_before = ctx.group->next_seq();
    {
      auto guard = ddp.no_sync();
      auto idx = range(r.begin, r.begin + half);
      (mlp_loss(m, rows(d.x, idx), rows(d.y, idx)) * 0.5).backward();
    }
    EXPECT_EQ(ctx.group->next_seq(), seq_before) << "no_sync must not communicate";
    auto idx = range(r.begin + half, r.end);
    (mlp_loss(m, rows(d.x, idx), rows(d.y, idx)) * 0.5).backward();
    ddp.synchronize();
    EXPECT_GT(ctx.group->next_seq(), seq_before);
    mlp_loss(ref, d.x, d.y).backward();
    expect_grads_close(m, ref, 1e-10, 1e-13);
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2)));
}

TEST(DistributedDataParallel, ZeroOneTrainingMatchesPlainDdpWithAThirdOfTheOptimizerState) {
  if (is_rank_process()) {
    auto ctx = init_distributed(quick_init());
    const int rank = ctx.info.rank, world = ctx.info.world_size;
    Mlp init = make_mlp(100, DType::f32), plain = make_mlp(100, DType::f32), zero = make_mlp(100, DType::f32);
    DdpOptions po;
    po.bucket_cap_mb = 300.0 / (1 << 20);
    DdpOptions zo = po;
    zo.zero_stage = 1;
    DistributedDataParallel dp(plain.params(), ctx.group, po), dz(zero.params(), ctx.group, zo);
    optim::AdamWOptions ao;
    ao.lr = 0.05;
    optim::AdamW opt_plain(dp.optimizer_params(), ao), opt_zero(dz.optimizer_params(), ao);
    int64_t total = 0, sharded = 0;
    for (const Tensor& p : plain.params()) total += p.numel();
    for (const Tensor& s : dz.optimizer_params()) sharded += s.numel();
    EXPECT_LE(sharded, total / world + static_cast<int64_t>(dz.bucket_layout().size()));
    EXPECT_GE(sharded * world, total);
    Data d = global_data(12, DType::f32);
    RowRange r = batch_shard(12, rank, world);
    auto idx = range(r.begin, r.end);
    for (int step = 0; step < 3; ++step) {
      mlp_loss(plain, rows(d.x, idx), rows(d.y, idx)).backward();
      dp.step(opt_plain);
      dp.zero_grad();
      mlp_loss(zero, rows(d.x, idx), rows(d.y, idx)).backward();
      dz.step(opt_zero);
      dz.zero_grad();
    }
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_LE(max_rel_error(zero.params()[i], plain.params()[i], 1e-5, 1e-6), 1.0) << "param " << i;
      EXPECT_GT(max_rel_error(plain.params()[i], init.params()[i], 1e-3, 1e-3), 1.0) << "param " << i << " moved";
    }
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(3)));
}

TEST(DistributedDataParallel, LossesOfAShardedRunDoNotDependOnTheWorldSize) {
  if (is_rank_process()) {
    auto ctx = init_distributed(quick_init());
    const int rank = ctx.info.rank, world = ctx.info.world_size;
    const int64_t n = 32, global = 8;
    Data d = global_data(n, DType::f32);
    Mlp ref = make_mlp(100, DType::f32), m = make_mlp(100, DType::f32);
    DistributedDataParallel ddp(m.params(), ctx.group);
    optim::SGDOptions so;
    so.lr = 0.3;
    so.momentum = 0.9;
    optim::SGD opt(ddp.optimizer_params(), so), opt_ref(ref.params(), so);
    DistributedSampler sampler(n, global, rank, world, true, 11), whole(n, global, 0, 1, true, 11);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      sampler.set_epoch(epoch);
      whole.set_epoch(epoch);
      for (int64_t step = 0; step < 2; ++step) {
        auto idx = sampler.indices(step);
        ASSERT_EQ(static_cast<int64_t>(idx.size()), global / world);
        Tensor loss = mlp_loss(m, rows(d.x, idx), rows(d.y, idx));
        loss.backward();
        ddp.step(opt);
        ddp.zero_grad();
        Tensor l = loss.detach().clone_raw();
        ctx.group->all_reduce(l, ReduceOp::Avg)->wait();
        Tensor ref_loss = mlp_loss(ref, rows(d.x, whole.indices(step)), rows(d.y, whole.indices(step)));
        ref_loss.backward();
        opt_ref.step();
        opt_ref.zero_grad();
        EXPECT_NEAR(l.item(), ref_loss.item(), 1e-5 * std::abs(ref_loss.item())) << "epoch " << epoch << " step " << step;
      }
    }
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2)));
  expect_ranks_pass(spawn_ranks(ingot::testing::world(4)));
}

TEST(DistributedDataParallel, BucketsTakeParametersInReverseOrderUpToTheCapAndSplitOnDtype) {
  LocalGroup g;
  manual_seed(1);
  std::vector<Tensor> ps = {leaf(randn({64})), leaf(randn({64})), leaf(randn({16}, DType::f64)),
                            leaf(randn({64})), leaf(randn({300}))};
  DdpOptions o;
  o.bucket_cap_mb = 512.0 / (1 << 20);  // 512 bytes = 128 f32
  DistributedDataParallel ddp(ps, g.group, o);
  // Reverse order: 4 (1200 B, over the cap alone), then 3; 2 is f64 (new bucket); then 1, 0 (256 B each).
  std::vector<std::vector<size_t>> want = {{4}, {3}, {2}, {1, 0}};
  EXPECT_EQ(ddp.bucket_layout(), want);
  // A world of one: synchronize leaves each gradient as it was.
  sum(mul(ps[0], ps[1])).backward();
  Tensor g0 = ps[0].grad().clone_raw();
  ddp.synchronize();
  EXPECT_EQ(max_rel_error(ps[0].grad(), g0, 0, 0), 0);
  EXPECT_EQ(max_rel_error(ps[0].grad(), ps[1].detach(), 0, 0), 0);
  // Parameters that got no gradient get zeros.
  ASSERT_TRUE(ps[4].grad().defined());
  EXPECT_EQ(ps[4].grad().to_vector(), std::vector<double>(300, 0.0));
}

TEST(DistributedDataParallel, MisuseIsReportedWithTheParameterName) {
  LocalGroup g;
  manual_seed(2);
  Tensor a = leaf(randn({4})), b = leaf(randn({4}));
  DistributedDataParallel ddp({a, b}, g.group);
  sum(mul(a, b)).backward();
  std::string msg = error_of([&] { sum(mul(a, b)).backward(); });
  EXPECT_NE(msg.find("parameter '#"), std::string::npos) << msg;
  EXPECT_NE(msg.find("second gradient before synchronize()"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no_sync()"), std::string::npos) << msg;
  {
    auto guard = ddp.no_sync();
    EXPECT_NE(error_of([&] { ddp.synchronize(); }).find("synchronize() called inside no_sync()"), std::string::npos);
  }
  Tensor plain = randn({3});
  EXPECT_NE(error_of([&] { DistributedDataParallel d({plain}, g.group); }).find("must be a leaf tensor with requires_grad"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DistributedDataParallel d({a, a}, g.group); }).find("parameter '#1' is listed twice"),
            std::string::npos);
  DdpOptions bad;
  bad.bucket_cap_mb = 0;
  EXPECT_NE(error_of([&] { DistributedDataParallel d({b}, g.group, bad); }).find("bucket_cap_mb must be > 0"),
            std::string::npos);
}

TEST(DistributedDataParallel, OverAModuleErrorsNameTheDottedParameterPath) {
  LocalGroup g;
  manual_seed(4);
  struct Net : nn::Module {
    std::shared_ptr<nn::Linear> fc1, fc2;
    Net() {
      fc1 = register_module("fc1", std::make_shared<nn::Linear>(3, 5));
      fc2 = register_module("fc2", std::make_shared<nn::Linear>(5, 2));
    }
  } net;
  DistributedDataParallel ddp(net, g.group);
  EXPECT_EQ(ddp.bucket_layout().size(), 1u);
  EXPECT_EQ(ddp.bucket_layout()[0], (std::vector<size_t>{3, 2, 1, 0}));
  Tensor x = randn({4, 3});
  sum(net.fc2->forward(tanh(net.fc1->forward(x)))).backward();
  std::string msg = error_of([&] { sum(net.fc2->forward(tanh(net.fc1->forward(x)))).backward(); });
  EXPECT_NE(msg.find("parameter 'fc"), std::string::npos) << msg;
  ddp.synchronize();
}

TEST(DistributedSampler, ShardsPartitionTheGlobalBatchAndShuffleDependsOnlyOnSeedAndEpoch) {
  DistributedSampler whole(50, 12, 0, 1, true, 3);
  EXPECT_EQ(whole.steps_per_epoch(), 4);
  std::vector<int64_t> g = whole.indices(1);
  std::vector<int64_t> joined;
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(50, 12, r, 4, true, 3);
    auto part = s.indices(1);
    EXPECT_EQ(part.size(), 3u);
    joined.insert(joined.end(), part.begin(), part.end());
  }
  EXPECT_EQ(joined, g);
  std::vector<int64_t> first = whole.indices(0);
  whole.set_epoch(1);
  EXPECT_NE(whole.indices(0), first);
  DistributedSampler ordered(50, 12, 1, 2, false);
  EXPECT_EQ(ordered.indices(2), range(30, 36));
  EXPECT_NE(error_of([] { batch_shard(10, 0, 4); }).find("global batch (10) must be a positive multiple of the world size (4)"),
            std::string::npos);
  EXPECT_NE(error_of([] { DistributedSampler s(5, 8, 0, 1); }).find("smaller than one global batch"), std::string::npos);
  EXPECT_NE(error_of([&] { whole.indices(4); }).find("step must be in [0, 4), got 4"), std::string::npos);
}

}  // namespace
}  // namespace ingot::distributed
