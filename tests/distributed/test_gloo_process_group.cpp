// Gloo process group with 2-4 real processes: collective values, async handles, input errors, and failures
// (timeouts and dead peers) reported by op, sequence number and missing ranks instead of hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "autograd/ops.h"
#include "distributed/bootstrap.h"
#include "distributed/process_group.h"
#include "distributed/spawn.h"
#include "runtime/allocator.h"
#include "tests/testing.h"
#include "runtime/file_util.h"
#include "runtime/rng.h"

namespace ingot::distributed {
namespace {

using namespace std::chrono_literals;
using ingot::testing::expect_ranks_pass;
using ingot::testing::is_rank_process;
using ingot::testing::spawn_ranks;

// Rank r's value at element i: distinct per rank and element, never zero.
double value(int r, int64_t i) { return 1.0 + 0.5 * r + 0.25 * static_cast<double>(i % 7) - 0.125 * (i % 3) * r; }

Tensor rank_tensor(int r, int64_t n, DType dt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(r, i);
  return from_vector(v, {n}, dt);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

InitOptions quick_init(Millis timeout = 5000ms) { return ingot::testing::gloo_test_init(timeout); }

TEST(GlooProcessGroup, AllReduceSumAvgMaxAgreeWithTheRankwiseFormulasOnFourRanks) {
  if (is_rank_process()) {
    auto ctx = init_distributed(quick_init());
    const int world = ctx.info.world_size, rank = ctx.info.rank;
    ASSERT_EQ(world, 4);
    EXPECT_EQ(ctx.group->backend(), "gloo");
    const int64_t n = 1000;
    for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
      Tensor s = rank_tensor(rank, n, dt), a = rank_tensor(rank, n, dt), m = rank_tensor(rank, n, dt);
      ctx.group->all_reduce(s, ReduceOp::Sum)->wait();
      ctx.group->all_reduce(a, ReduceOp::Avg)->wait();
      ctx.group->all_reduce(m, ReduceOp::Max)->wait();
      double tol = dt == DType::bf16 ? 2e-2 : 1e-5;
      for (int64_t i = 0; i < n; i += 37) {
        double sum = 0, mx = -1e9;
        for (int r = 0; r < world; ++r) {
          double x = rank_tensor(r, n, dt).item_at(i);  // the rounded input each rank contributed
          sum += x;
          mx = std::max(mx, x);
        }
        EXPECT_NEAR(s.item_at(i), sum, tol * std::abs(sum)) << dtype_name(dt) << " i=" << i;
        EXPECT_NEAR(a.item_at(i), sum / world, tol * std::abs(sum)) << dtype_name(dt) << " i=" << i;
        EXPECT_EQ(m.item_at(i), mx) << dtype_name(dt) << " i=" << i;
      }
    }
    Tensor ints = from_vector_i64({rank + 1, 10 * rank, -rank}, {3});
    ctx.group->all_reduce(ints, ReduceOp::Sum)->wait();
    EXPECT_EQ(ints.item_at(0), 10);
    EXPECT_EQ(ints.item_at(1), 60);
    EXPECT_EQ(ints.item_at(2), -6);
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(4)));
}

// The average scales the reduced sum in its own buffer: no second buffer the size of the tensor (a DDP bucket) is
// allocated for it, and the values are the rankwise mean, bit for bit.
TEST(GlooProcessGroup, AnAverageScalesTheSumInPlaceWithoutASecondBuffer) {
  if (is_rank_process()) {
    auto ctx = init_distributed(quick_init());
    const int world = ctx.info.world_size, rank = ctx.info.rank;
    const int64_t n = 1 << 18;  // 1 MiB of f32
    Tensor a = rank_tensor(rank, n, DType::f32);
    const AllocatorStats before = allocator_for(Device::cpu()).stats();
    ctx.group->all_reduce(a, ReduceOp::Avg)->wait();
    const AllocatorStats after = allocator_for(Device::cpu()).stats();
    EXPECT_EQ(after.num_allocs, before.num_allocs) << "the average allocated a buffer of our allocator";
    for (int64_t i = 0; i < n; i += 997) {
      float sum = 0;
      for (int r = 0; r < world; ++r) sum += static_cast<float>(value(r, i));
      EXPECT_EQ(a.item_at(i), static_cast<double>(sum * static_cast<float>(1.0 / world))) << "i=" << i;
    }
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2)));
}

TEST(GlooProcessGroup, ReduceScatterGivesEachRankItsChunkAndAllGatherRebuildsTheWhole) {
  if (is_rank_process()) {
    auto ctx = init_distributed(quick_init());
    const int world = ctx.info.world_size, rank = ctx.info.rank;
    const int64_t chunk = 5;
    Tensor in = reshape(rank_tensor(rank, chunk * world, DType::f32), {world, chunk});
    Tensor mine = empty({chunk});
    ctx.group->reduce_scatter(mine, in, ReduceOp::Sum)->wait();
    for (int64_t i = 0; i < chunk; ++i) {
      double want = 0;
      for (int r = 0; r < world; ++r) want += value(r, rank * chunk + i);
      EXPECT_NEAR(mine.item_at(i), want, 1e-5) << "i=" << i;
    }
    Tensor whole = empty({world * chunk});
    ctx.group->all_gather(whole, mine)->wait();
    for (int64_t j = 0; j < world * chunk; ++j) {
      double want = 0;
      for (int r = 0; r < world; ++r) want += value(r, j);
      EXPECT_NEAR(whole.item_at(j), want, 1e-5) << "j=" << j;
    }
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(3)));
}

// all_to_all: rank p's chunk q lands on rank q as its chunk p, bit for bit, every rank's own chunk included; a
// length that does not split over the ranks is refused by name.
TEST(GlooProcessGroup, AllToAllHandsEachRankEveryRanksChunkForItAndExchangeChunksAllButItsOwn) {
  if (is_rank_process()) {
    auto ctx = init_distributed(quick_init());
    const int world = ctx.info.world_size, rank = ctx.info.rank;
    const int64_t chunk = 6;
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor in = rank_tensor(rank, chunk * world, dt), out = empty({chunk * world}, dt);
      ctx.group->all_to_all(out, in)->wait();
      for (int p = 0; p < world; ++p)
        for (int64_t i = 0; i < chunk; ++i)
          ASSERT_EQ(out.item_at(p * chunk + i), rank_tensor(p, chunk * world, dt).item_at(rank * chunk + i))
              << dtype_name(dt) << ": from rank " << p << ", element " << i;
    }
    Tensor odd = empty({chunk * world + 1});
    EXPECT_NE(ingot::testing::error_of([&] { ctx.group->all_to_all(odd, odd); }).find("all_to_all: input and output "
                                                                                      "must hold world size"),
              std::string::npos);
    // exchange_chunks (Note [Pieces read by the update]): the same pieces without this rank's own, in rank order.
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor in = rank_tensor(rank, chunk * world, dt), out = empty({chunk * (world - 1)}, dt);
      ctx.group->exchange_chunks(out, in)->wait();
      for (int p = 0, k = 0; p < world; ++p) {
        if (p == rank) continue;
        for (int64_t i = 0; i < chunk; ++i)
          ASSERT_EQ(out.item_at(k * chunk + i), rank_tensor(p, chunk * world, dt).item_at(rank * chunk + i))
              << "exchange_chunks " << dtype_name(dt) << ": from rank " << p << ", element " << i;
        ++k;
      }
    }
    Tensor whole = empty({chunk * world});
    EXPECT_NE(ingot::testing::error_of([&] { ctx.group->exchange_chunks(whole, whole); })
                  .find("exchange_chunks: input must hold world size"),
              std::string::npos);
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(3)));
}

// ProcessGroup::all_gather_cast's own way (the cast on the current stream, then all_gather): every rank's values
// in the output's dtype, rounded as a cast rounds them; the same dtype gathers unchanged.
TEST(GlooProcessGroup, AnAllGatherCastGathersEveryRanksValuesRoundedToTheOutputsDtype) {
  if (is_rank_process()) {
    auto ctx = init_distributed(quick_init());
    const int world = ctx.info.world_size, rank = ctx.info.rank;
    const int64_t n = 37;
    auto values_of = [&](int r) {
      manual_seed(500 + static_cast<uint64_t>(r));
      return randn({n}, DType::f32);
    };
    Tensor out = empty({n * world}, DType::bf16);
    ctx.group->all_gather_cast(out, values_of(rank))->wait();
    Tensor same = empty({n * world}, DType::f32);
    ctx.group->all_gather_cast(same, values_of(rank))->wait();
    for (int r = 0; r < world; ++r) {
      const Tensor want = values_of(r), rounded = want.to(DType::bf16);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(out.item_at(r * n + i), rounded.item_at(i)) << "rank " << r << " element " << i;
        ASSERT_EQ(same.item_at(r * n + i), want.item_at(i)) << "rank " << r << " element " << i;
      }
      EXPECT_NE(rounded.item_at(0), want.item_at(0)) << "the values must need rounding";
    }
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(3)));
}

TEST(GlooProcessGroup, BroadcastCopiesTheRootsTensorAndAsyncHandlesCompleteInIssueOrder) {
  if (is_rank_process()) {
    auto ctx = init_distributed(quick_init());
    const int rank = ctx.info.rank;
    Tensor b = rank_tensor(rank, 64, DType::f64);
    Tensor x = rank_tensor(rank, 1 << 16, DType::f32), y = rank_tensor(rank, 3, DType::f32);
    auto w1 = ctx.group->broadcast(b, 2);
    auto w2 = ctx.group->all_reduce(x, ReduceOp::Max);
    auto w3 = ctx.group->barrier();
    auto w4 = ctx.group->all_reduce(y, ReduceOp::Sum);
    EXPECT_EQ(w4->seq(), w1->seq() + 3);
    w4->wait(5000ms);
    // The group runs collectives in order: by the time the last is done, the earlier ones are too.
    EXPECT_TRUE(w1->is_completed() && w2->is_completed() && w3->is_completed());
    for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(b.item_at(i), value(2, i));
    EXPECT_NEAR(y.item_at(1), value(0, 1) + value(1, 1) + value(2, 1), 1e-6);
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(3).rank0_hosts_store()));
}

TEST(GlooProcessGroup, BadInputsAreRejectedWithTheOpAndTheShapeNamed) {
  auto server = std::make_shared<TcpStoreServer>(0, "127.0.0.1");
  auto store = std::make_shared<TcpStore>("127.0.0.1", server->port());
  ProcessGroupOptions o;
  o.hostname = "127.0.0.1";
  auto pg = new_gloo_group(store, 0, 1, o);
  Tensor t = randn({4, 6});
  Tensor nc = t.as_strided({6, 4}, {1, 6}, 0);
  EXPECT_NE(error_of([&] { pg->all_reduce(nc); }).find("all_reduce: the tensor must be contiguous, got shape [6, 4]"),
            std::string::npos);
  Tensor ints = from_vector_i64({1, 2}, {2});
  EXPECT_NE(error_of([&] { pg->all_reduce(ints, ReduceOp::Avg); }).find("avg needs a floating tensor, got i64"),
            std::string::npos);
  Tensor out = empty({5});
  EXPECT_NE(error_of([&] { pg->reduce_scatter(out, t); }).find("world size (1) x output elements"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pg->all_gather(out, t); }).find("all_gather: output must hold world size (1)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pg->broadcast(t, 1); }).find("broadcast: root must be in [0, 1), got 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { new_gloo_group(store, 2, 2, o); }).find("rank must be in [0, world size), got rank 2 of 2"),
            std::string::npos);
  // A world of one still works, and the seq counts only issued collectives.
  Tensor v = from_vector({1.5, -2.0}, {2});
  pg->all_reduce(v, ReduceOp::Avg)->wait();
  EXPECT_EQ(v.item_at(1), -2.0);
}

TEST(GlooProcessGroup, CreatingAGroupWhosePeerNeverComesTimesOutNamingTheRendezvous) {
  auto server = std::make_shared<TcpStoreServer>(0, "127.0.0.1");
  auto store = std::make_shared<TcpStore>("127.0.0.1", server->port());
  ProcessGroupOptions o;
  o.hostname = "127.0.0.1";
  o.name = "lonely";
  o.rendezvous_timeout = 200ms;
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = error_of([&] { new_gloo_group(store, 0, 2, o); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3000ms);
  EXPECT_NE(msg.find("gloo group 'lonely' rank 0/2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("200 ms"), std::string::npos) << msg;
}

TEST(GlooProcessGroup, ACollectiveTimeoutNamesTheOpTheSequenceNumberAndTheMissingRank) {
  if (is_rank_process()) {
    TempDir traces("ingot_trace");
    InitOptions o = quick_init(400ms);
    o.trace_dir = traces.path();
    auto ctx = init_distributed(o);
    const int rank = ctx.info.rank;
    Tensor x = rank_tensor(rank, 8, DType::f32);
    ctx.group->all_reduce(x)->wait();  // #0: everybody
    if (rank == 2) {
      // Rank 2 skips #1 and stays alive until the others have seen the timeout.
      ctx.store->wait({"others_done0", "others_done1"}, 10000ms);
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    std::string msg = error_of([&] { ctx.group->all_reduce(x)->wait(); });
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 4000ms);
    EXPECT_NE(msg.find("all_reduce #1 failed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ranks that never joined it: [2]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(rank) + "/3"), std::string::npos) << msg;
    std::string trace = traces.file("ingot_collectives_world_rank" + std::to_string(rank) + ".json");
    EXPECT_NE(msg.find(trace), std::string::npos) << msg;
    std::string text = ingot::testing::read_text(trace);
    EXPECT_NE(text.find("\"state\": \"failed\""), std::string::npos) << text;
    EXPECT_NE(text.find("\"state\": \"completed\""), std::string::npos) << text;
    // The group is unusable afterwards, and says why.
    std::string again = error_of([&] { ctx.group->barrier(); });
    EXPECT_NE(again.find("unusable after an earlier failure"), std::string::npos) << again;
    ctx.store->set("others_done" + std::to_string(rank), "1");
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(3)));
}

TEST(GlooProcessGroup, APeerThatDiesMidRunIsReportedNotWaitedFor) {
  if (is_rank_process()) {
    // Rank 1 dies by _exit (no destructors): only the survivor makes a trace directory.
    auto traces = ingot::testing::env_rank() == 1 ? nullptr : std::make_unique<TempDir>("ingot_trace");
    InitOptions o = quick_init(20000ms);
    o.trace_dir = traces ? traces->path() : "/tmp";
    auto ctx = init_distributed(o);
    Tensor x = rank_tensor(ctx.info.rank, 8, DType::f32);
    ctx.group->all_reduce(x)->wait();
    if (ctx.info.rank == 1) _exit(3);
    auto t0 = std::chrono::steady_clock::now();
    std::string msg = error_of([&] { ctx.group->all_reduce(x)->wait(); });
    // Far below the 20 s collective timeout: the closed connection is the signal.
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5000ms);
    EXPECT_NE(msg.find("all_reduce #1 failed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ranks that never joined it: [1]"), std::string::npos) << msg;
    return;
  }
  auto results = spawn_ranks(ingot::testing::world(2));
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
  EXPECT_EQ(results[1].exit_code, 3) << results[1].output;
}

}  // namespace
}  // namespace ingot::distributed
