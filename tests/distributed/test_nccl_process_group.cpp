// NCCL process group on real GPUs (2 ranks, one GPU each): collective values, DDP on CUDA against a CPU
// reference, and the watchdog turning a missing rank into a named error. Skips with the reason without GPUs.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "autograd/ops.h"
#include "distributed/bootstrap.h"
#include "distributed/collective_ops.h"
#include "distributed/ddp.h"
#include "distributed/process_group.h"
#include "distributed/spawn.h"
#include "runtime/cuda_runtime.h"
#include "runtime/device.h"
#include "runtime/file_util.h"
#include "runtime/kernels/kernels.h"
#include "runtime/rng.h"
#include "tests/testing.h"

namespace ingot::distributed {
namespace {

using namespace std::chrono_literals;
using ingot::testing::expect_ranks_pass;
using ingot::testing::is_rank_process;
using ingot::testing::spawn_ranks;

#define INGOT_REQUIRE_TWO_GPUS()                                                                          \
  do {                                                                                                    \
    if (!nccl_available()) GTEST_SKIP() << "built without NCCL (CPU-only build); runs on the GPU machine"; \
    if (cuda_device_count() < 2)                                                                          \
      GTEST_SKIP() << "needs 2 CUDA devices, found " << cuda_device_count() << "; runs on nvidia-h200-x2"; \
  } while (0)

using ingot::testing::error_of;

InitOptions nccl_init(Millis timeout = 20000ms) {
  InitOptions o;
  o.backend = "nccl";
  o.timeout = timeout;
  o.store_timeout = 20000ms;
  o.connect_timeout = 20000ms;
  o.report_grace = 1000ms;
  return o;
}

double value(int r, int64_t i) { return 1.0 + 0.5 * r + 0.25 * static_cast<double>(i % 7); }

Tensor rank_tensor(int r, int64_t n, DType dt, Device dev) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(r, i);
  return from_vector(v, {n}, dt, dev);
}

TEST(NcclProcessGroup, CollectivesOnTwoGpusAgreeWithTheRankwiseFormulas) {
  if (is_rank_process()) {
    auto ctx = init_distributed(nccl_init());
    const int rank = ctx.info.rank;
    ASSERT_EQ(ctx.group->backend(), "nccl");
    Device dev(DeviceType::cuda, ctx.info.local_rank);
    const int64_t n = 1 << 20;
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor s = rank_tensor(rank, n, dt, dev), a = rank_tensor(rank, n, dt, dev), m = rank_tensor(rank, n, dt, dev);
      ctx.group->all_reduce(s, ReduceOp::Sum);
      ctx.group->all_reduce(a, ReduceOp::Avg);
      ctx.group->all_reduce(m, ReduceOp::Max)->wait(10000ms);
      Tensor hs = s.to(Device::cpu()), ha = a.to(Device::cpu()), hm = m.to(Device::cpu());
      double tol = dt == DType::bf16 ? 1e-2 : 1e-6;
      for (int64_t i = 0; i < n; i += 4099) {
        double sum = value(0, i) + value(1, i);
        EXPECT_NEAR(hs.item_at(i), sum, tol * sum) << i;
        EXPECT_NEAR(ha.item_at(i), sum / 2, tol * sum) << i;
        EXPECT_NEAR(hm.item_at(i), value(1, i), tol * sum) << i;
      }
    }
    Tensor in = rank_tensor(rank, 8, DType::f32, dev), out = zeros({4}, DType::f32, dev);
    ctx.group->reduce_scatter(out, in, ReduceOp::Sum)->wait();
    Tensor all = zeros({8}, DType::f32, dev);
    ctx.group->all_gather(all, out)->wait();
    for (int64_t i = 0; i < 8; ++i) EXPECT_NEAR(all.to(Device::cpu()).item_at(i), value(0, i) + value(1, i), 1e-6);
    Tensor b = rank_tensor(rank, 16, DType::f32, dev);
    ctx.group->broadcast(b, 1)->wait();
    EXPECT_EQ(b.to(Device::cpu()).item_at(5), value(1, 5));
    ctx.group->barrier()->wait();
    Tensor cpu = zeros({2});
    EXPECT_NE(error_of([&] { ctx.group->all_reduce(cpu); }).find("takes CUDA tensors, got a tensor on cpu"),
              std::string::npos);
    return;
  }
  INGOT_REQUIRE_TWO_GPUS();
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2).within(60000ms)));
}

// Note [Gathers cast on the comm stream]: each rank's f32 values reach every rank as bf16, rounded exactly as a
// cast on the CPU rounds them, and the comm stream's cast reads the values the producer stream wrote last: the
// write is queued behind a 50 ms hold of the producer stream, so a cast that did not wait for it reads the old ones.
TEST(NcclProcessGroup, AnAllGatherCastFromF32ReadsTheProducersLastWriteAndRoundsAsTheCpu) {
  if (is_rank_process()) {
    auto ctx = init_distributed(nccl_init());
    const int rank = ctx.info.rank, world = ctx.info.world_size;
    const Device dev(DeviceType::cuda, ctx.info.local_rank);
    const int64_t n = (1 << 20) + 3;  // odd: the cast's tail past its 16-byte packs
    auto values_of = [&](int r) {
      manual_seed(1000 + static_cast<uint64_t>(r));
      return randn({n}, DType::f32, Device::cpu());
    };
    Tensor master = values_of(rank).to(dev);
    const Tensor last = values_of(rank + 100).to(dev);
    cuda::synchronize_device(dev.index);
    cuda::hold_stream(cuda::current_stream(dev.index), 50.0);
    master.copy_(last);  // behind the hold: the cast must see it
    Tensor out = empty({n * world}, DType::bf16, dev);
    ctx.group->all_gather_cast(out, master)->wait(10000ms);
    const Tensor got = out.to(Device::cpu());
    for (int r = 0; r < world; ++r) {
      const Tensor want = values_of(r + 100).to(DType::bf16);
      for (int64_t i = 0; i < n; i += 1021)
        ASSERT_EQ(got.item_at(r * n + i), want.item_at(i)) << "rank " << r << " element " << i;
      ASSERT_EQ(got.item_at(r * n + n - 1), want.item_at(n - 1)) << "rank " << r << " last element";
    }
    // Same dtype: a plain all_gather.
    Tensor same = empty({n * world}, DType::f32, dev);
    ctx.group->all_gather_cast(same, master)->wait(10000ms);
    const Tensor got_same = same.to(Device::cpu());
    for (int r = 0; r < world; ++r) {
      const Tensor want = values_of(r + 100);
      for (int64_t i = 0; i < n; i += 4093)
        ASSERT_EQ(got_same.item_at(r * n + i), want.item_at(i)) << "rank " << r << " element " << i;
    }
    return;
  }
  INGOT_REQUIRE_TWO_GPUS();
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2).within(60000ms)));
}

// Note [Narrow wire, wide sum] (distributed/process_group.h): each rank's chunk is the world's bf16 pieces added in
// f32 in rank order and scaled once, bit for bit what the CPU's sum_pieces gives from the same pieces, and the
// all-to-all reads what the producer stream wrote last (queued behind a 50 ms hold). A bf16 reduce-scatter (every
// partial sum rounded to bf16) gives other values: the test can tell the two apart.
TEST(NcclProcessGroup, AWidenedReduceScatterSumsEveryRanksBf16PiecesInF32AsTheCpu) {
  if (is_rank_process()) {
    auto ctx = init_distributed(nccl_init());
    const int rank = ctx.info.rank, world = ctx.info.world_size;
    const Device dev(DeviceType::cuda, ctx.info.local_rank);
    const int64_t chunk = (1 << 20) + 8;
    auto values_of = [&](int r) {
      manual_seed(2000 + static_cast<uint64_t>(r));
      return randn({chunk * world}, DType::f32, Device::cpu()).to(DType::bf16);
    };
    Tensor in = zeros({chunk * world}, DType::bf16, dev);
    const Tensor last = values_of(rank).to(dev);
    cuda::synchronize_device(dev.index);
    cuda::hold_stream(cuda::current_stream(dev.index), 50.0);
    in.copy_(last);  // behind the hold: the all-to-all must see it
    for (const ReduceOp op : {ReduceOp::Avg, ReduceOp::Sum}) {
      Tensor out = empty({chunk}, DType::f32, dev);
      ctx.group->reduce_scatter_widen(out, in, op)->wait(10000ms);
      std::vector<Tensor> pieces;
      for (int r = 0; r < world; ++r) pieces.push_back(contiguous(narrow(values_of(r), 0, rank * chunk, chunk)));
      Tensor want = empty({chunk}, DType::f32);
      kernels::cpu::sum_pieces(want, pieces, op == ReduceOp::Avg ? 1.0 / world : 1.0, 0);
      const std::vector<double> got = out.to(Device::cpu()).to_vector(), exp = want.to_vector();
      int64_t unequal = 0;
      for (size_t i = 0; i < exp.size(); ++i) unequal += got[i] != exp[i] ? 1 : 0;
      EXPECT_EQ(unequal, 0) << reduce_op_name(op) << ": elements unlike the CPU's f32 sum of the bf16 pieces";
      if (op == ReduceOp::Avg) {
        Tensor narrow_sum = empty({chunk}, DType::bf16, dev);
        ctx.group->reduce_scatter(narrow_sum, in, ReduceOp::Avg)->wait(10000ms);
        const std::vector<double> rounded = narrow_sum.to(Device::cpu()).to_vector();
        int64_t differ = 0;
        for (size_t i = 0; i < exp.size(); ++i) differ += rounded[i] != exp[i] ? 1 : 0;
        EXPECT_GT(differ, chunk / 4) << "a bf16 reduce-scatter must round the sums, else this test checks nothing";
      }
    }
    // The exchange alone (all_to_all): rank p's chunk for this rank lands as chunk p, bit for bit.
    Tensor swapped = empty({chunk * world}, DType::bf16, dev);
    ctx.group->all_to_all(swapped, in)->wait(10000ms);
    const std::vector<double> got_all = swapped.to(Device::cpu()).to_vector();
    for (int r = 0; r < world; ++r) {
      const std::vector<double> sent = values_of(r).to_vector();
      for (int64_t i = 0; i < chunk; i += 1021)
        ASSERT_EQ(got_all[static_cast<size_t>(r * chunk + i)], sent[static_cast<size_t>(rank * chunk + i)])
            << "from rank " << r << ", element " << i;
    }
    // exchange_chunks (Note [Pieces read by the update]): the others' chunks for this rank, its own left out.
    Tensor others = empty({chunk * (world - 1)}, DType::bf16, dev);
    ctx.group->exchange_chunks(others, in)->wait(10000ms);
    const std::vector<double> got_others = others.to(Device::cpu()).to_vector();
    for (int r = 0, k = 0; r < world; ++r) {
      if (r == rank) continue;
      const std::vector<double> sent = values_of(r).to_vector();
      for (int64_t i = 0; i < chunk; i += 1021)
        ASSERT_EQ(got_others[static_cast<size_t>(k * chunk + i)], sent[static_cast<size_t>(rank * chunk + i)])
            << "exchange_chunks from rank " << r << ", element " << i;
      ++k;
    }
    // Not wider: refused by name.
    Tensor bad = empty({chunk}, DType::bf16, dev);
    Tensor f32_in = zeros({chunk * world}, DType::f32, dev);
    EXPECT_NE(error_of([&] { ctx.group->reduce_scatter_widen(bad, f32_in, ReduceOp::Avg); }).find("reduce_scatter_widen"),
              std::string::npos);
    return;
  }
  INGOT_REQUIRE_TWO_GPUS();
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2).within(60000ms)));
}

// ProcessGroup::symmetric_empty: tensors in NCCL symmetric windows (ncclMemAlloc + NCCL_WIN_COLL_SYMMETRIC) hold what
// ordinary tensors hold, and a bf16 reduce-scatter and an f32 all-reduce (sum and average) between them give every rank's sum: within
// one bf16 rounding of the f32 sum (NCCL's symmetric kernels sum in f32; a ring may round partial sums: the test
// prints how many of the sampled elements equal the once-rounded sum). Freed in the same order on every rank.
TEST(NcclProcessGroup, SymmetricWindowsHoldTensorsAndTheirCollectivesSumEveryRank) {
  if (is_rank_process()) {
    auto ctx = init_distributed(nccl_init());
    const int rank = ctx.info.rank, world = ctx.info.world_size;
    const Device dev(DeviceType::cuda, ctx.info.local_rank);
    const int64_t chunk = (1 << 18) + 64;
    auto values_of = [&](int r) {
      manual_seed(3000 + static_cast<uint64_t>(r));
      return randn({chunk * world}, DType::f32, Device::cpu()).to(DType::bf16);
    };
    for (int round = 0; round < 2; ++round) {  // the second round reuses freed windows' addresses
      Tensor in = ctx.group->symmetric_empty({chunk * world}, DType::bf16, dev);
      Tensor out = ctx.group->symmetric_empty({chunk}, DType::bf16, dev);
      in.copy_(values_of(rank).to(dev));
      ctx.group->reduce_scatter(out, in, ReduceOp::Sum)->wait(10000ms);
      std::vector<double> want(static_cast<size_t>(chunk), 0.0);
      for (int r = 0; r < world; ++r) {
        const std::vector<double> v = values_of(r).to_vector();
        for (int64_t i = 0; i < chunk; ++i) want[static_cast<size_t>(i)] += v[static_cast<size_t>(rank * chunk + i)];
      }
      const std::vector<double> got = out.to(Device::cpu()).to_vector();
      const std::vector<double> once = from_vector(want, {chunk}).to(DType::bf16).to_vector();
      int64_t exact = 0, sampled = 0;
      for (int64_t i = 0; i < chunk; i += 97, ++sampled) {
        const double w = want[static_cast<size_t>(i)];
        ASSERT_NEAR(got[static_cast<size_t>(i)], w, 1e-2 * std::abs(w) + 2e-2) << "element " << i;
        exact += got[static_cast<size_t>(i)] == once[static_cast<size_t>(i)];
      }
      if (rank == 0 && round == 0)
        std::printf("[ nccl     ] symmetric bf16 reduce-scatter: %lld of %lld sampled sums equal the f32 sum rounded "
                    "once\n", static_cast<long long>(exact), static_cast<long long>(sampled));
      Tensor f = ctx.group->symmetric_empty({4099}, DType::f32, dev);
      f.fill_(static_cast<double>(rank + 1));
      ctx.group->all_reduce(f, ReduceOp::Sum)->wait(10000ms);
      EXPECT_EQ(f.to(Device::cpu()).to_vector()[4098], world * (world + 1) / 2.0);
      // An average in a window: the symmetric kernels' sum, scaled after it on the comm stream.
      f.fill_(static_cast<double>(rank + 1));
      ctx.group->all_reduce(f, ReduceOp::Avg)->wait(10000ms);
      EXPECT_EQ(f.to(Device::cpu()).to_vector()[17], (world + 1) / 2.0);
    }
    return;
  }
  INGOT_REQUIRE_TWO_GPUS();
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2).within(60000ms)));
}

// Note [Collectives in CUDA graphs] (distributed/nccl_process_group.cpp): a captured reduce-scatter whose input
// the caller drops right after the start (as the compiled step does: the start is the input's last reader) keeps
// that block until its wait joins the comm stream back, so a later allocation of the capture cannot take it and
// overwrite it while the NCCL node reads it at every replay. One rank on one GPU: the block reuse is the same.
TEST(NcclProcessGroup, ACapturedCollectiveKeepsItsInputUntilItsWait) {
  if (is_rank_process()) {
    auto ctx = init_distributed(nccl_init());
    const Device dev(DeviceType::cuda, ctx.info.local_rank);
    const int64_t n = 1 << 16;
    const Tensor want = rank_tensor(0, n, DType::f32, Device::cpu());
    const cuda::Stream prev = cuda::current_stream(dev.index);
    const cuda::Stream s = cuda::create_stream(dev.index);
    cuda::set_current_stream(s);
    const Tensor src = want.to(dev);
    cuda::synchronize_stream(s);
    {
      // A block of the input's size cached on the capture's stream, as in a compiled step's steady state.
      Tensor warm = empty({n}, DType::f32, dev);
    }
    cuda::begin_capture(s);
    Tensor in = src.clone_raw();
    const void* in_block = in.data_ptr();
    Tensor pending = reduce_scatter_start(in, ctx.group);
    in = Tensor();
    Tensor later = empty({n}, DType::f32, dev);
    later.fill_(-7.0);
    const void* later_block = later.data_ptr();
    Tensor out = collective_wait(pending);
    void* exec = cuda::end_capture(s);
    EXPECT_NE(later_block, in_block) << "a block the captured reduce-scatter reads was reused before its wait";
    for (int replay = 0; replay < 3; ++replay) cuda::launch_graph(exec, s);
    cuda::synchronize_stream(s);
    const Tensor got = out.to(Device::cpu());
    for (int64_t i = 0; i < n; i += 997) EXPECT_EQ(got.item_at(i), want.item_at(i)) << i;
    cuda::destroy_graph(exec);
    cuda::set_current_stream(prev);
    return;
  }
  if (!nccl_available()) GTEST_SKIP() << "built without NCCL (CPU-only build); runs on the GPU machine";
  if (cuda_device_count() < 1) GTEST_SKIP() << "needs a CUDA device; runs on the lent GPU machine";
  expect_ranks_pass(spawn_ranks(ingot::testing::world(1).within(60000ms)));
}

// Note [Step timeline] (distributed/nccl_process_group.cpp), what every "exposed" figure of bench/RESULTS.md reads:
// a wait queued right after its all-reduce stands for the collective's whole run (exposed ~ its span), one queued
// behind ~100 ms of products finds it finished (nothing exposed); each step's slot names the collective and its
// bytes, and the slots' exposure adds up to the step's.
TEST(NcclProcessGroup, TheStepTimelineCountsAWaitAtAnUnfinishedCollectiveAsExposed) {
  if (is_rank_process()) {
    auto ctx = init_distributed(nccl_init());
    const Device dev(DeviceType::cuda, ctx.info.local_rank);
    const cuda::Stream s = cuda::current_stream(dev.index);
    const int64_t n = int64_t{1} << 26;  // 256 MB of f32
    Tensor big = rank_tensor(ctx.info.rank, n, DType::f32, dev);
    const Tensor a = randn({4096, 4096}, DType::f32, dev);
    ctx.group->all_reduce(big)->wait();  // the communicator's first collective (set-up) outside the timed steps
    ctx.group->timeline_begin_step(s);
    ctx.group->all_reduce(big)->block_stream(s);
    const std::optional<ProcessGroup::StepTimeline> at_once = ctx.group->timeline_end_step(s);
    ctx.group->timeline_begin_step(s);
    std::shared_ptr<Work> w = ctx.group->all_reduce(big);
    {
      NoGradGuard no_grad;
      for (int i = 0; i < 40; ++i) (void)matmul(a, a);
    }
    w->block_stream(s);
    const std::optional<ProcessGroup::StepTimeline> later = ctx.group->timeline_end_step(s);
    ASSERT_TRUE(at_once && later);
    for (const ProcessGroup::StepTimeline* t : {&*at_once, &*later}) {
      ASSERT_EQ(t->collectives, 1);
      ASSERT_EQ(t->slots.size(), 1u);
      EXPECT_EQ(t->slots[0].op, "all_reduce");
      EXPECT_EQ(t->slots[0].bytes, static_cast<double>(n * 4));
      EXPECT_LE(0.0, t->slots[0].start_ms);
      EXPECT_LT(t->slots[0].start_ms, t->slots[0].end_ms);
      EXPECT_DOUBLE_EQ(t->slots[0].exposed_ms, t->exposed_ms);
    }
    const double span = at_once->slots[0].end_ms - at_once->slots[0].start_ms;
    std::printf("[ timeline ] rank %d: waited at once: span %.3f ms, exposed %.3f ms; behind products: step %.1f ms, "
                "exposed %.3f ms\n",
                ctx.info.rank, span, at_once->exposed_ms, later->step_ms, later->exposed_ms);
    EXPECT_GT(at_once->exposed_ms, 0.5 * span);
    EXPECT_LT(later->exposed_ms, 0.05);
    EXPECT_GT(later->step_ms, 20.0) << "the products did not keep the stream busy past the all-reduce";
    return;
  }
  INGOT_REQUIRE_TWO_GPUS();
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2).within(60000ms)));
}

// INGOT_COMM_STREAM_PRIORITY (an A/B switch, Note [Comm stream priority]): "low" gives the comm stream the device's
// lowest priority, unset the highest; another value is an error naming the variable before anything is made.
TEST(NcclProcessGroup, CommStreamPriorityFollowsItsSwitchAndRefusesAnUnknownValue) {
  if (is_rank_process()) {
    const std::string v = std::getenv("INGOT_COMM_STREAM_PRIORITY") ? std::getenv("INGOT_COMM_STREAM_PRIORITY") : "";
    if (v == "sideways") {
      EXPECT_NE(error_of([] { init_distributed(nccl_init()); }).find("INGOT_COMM_STREAM_PRIORITY"), std::string::npos);
      return;
    }
    auto ctx = init_distributed(nccl_init());
    const auto [least, greatest] = cuda::stream_priority_range(ctx.group->comm_stream().device);
    EXPECT_EQ(cuda::stream_priority(ctx.group->comm_stream()), v == "low" ? least : greatest)
        << "INGOT_COMM_STREAM_PRIORITY='" << v << "'";
    return;
  }
  if (!nccl_available()) GTEST_SKIP() << "built without NCCL (CPU-only build); runs on the GPU machine";
  if (cuda_device_count() < 1) GTEST_SKIP() << "needs a CUDA device; runs on the lent GPU machine";
  for (const char* v : {"", "low", "sideways"}) {
    ingot::testing::SpawnOptions o = ingot::testing::world(1).within(60000ms);
    if (*v) o.env["INGOT_COMM_STREAM_PRIORITY"] = v;
    expect_ranks_pass(spawn_ranks(o));
  }
}

// INGOT_NCCL_CTA_POLICY (ncclConfig_t::CTAPolicy, measured in bench/RESULTS.md 2026-11-27): NCCL accepts each named
// policy (a communicator made with it sums; what the policy does to NCCL's CTAs is NCCL's and is not observable
// here), and anything else is an error naming the variable, before any communicator is made.
TEST(NcclProcessGroup, CtaPolicyFollowsItsSwitchAndRefusesAnUnknownValue) {
  if (is_rank_process()) {
    const std::string v = std::getenv("INGOT_NCCL_CTA_POLICY") ? std::getenv("INGOT_NCCL_CTA_POLICY") : "";
    if (v == "lavish") {
      const std::string err = error_of([] { init_distributed(nccl_init()); });
      EXPECT_NE(err.find("INGOT_NCCL_CTA_POLICY must be 'default', 'efficiency' or 'zero', got 'lavish'"),
                std::string::npos) << err;
      return;
    }
    auto ctx = init_distributed(nccl_init());
    Tensor t = rank_tensor(ctx.info.rank, 4096, DType::f32, Device(DeviceType::cuda, ctx.info.local_rank));
    ctx.group->all_reduce(t, ReduceOp::Sum)->wait(10000ms);
    EXPECT_NEAR(t.to(Device::cpu()).item_at(5), value(0, 5) + value(1, 5), 1e-5) << "INGOT_NCCL_CTA_POLICY='" << v << "'";
    return;
  }
  INGOT_REQUIRE_TWO_GPUS();
  for (const char* v : {"efficiency", "zero", "lavish"}) {
    ingot::testing::SpawnOptions o = ingot::testing::world(2).within(60000ms);
    o.env["INGOT_NCCL_CTA_POLICY"] = v;
    expect_ranks_pass(spawn_ranks(o));
  }
}

// INGOT_ALL_REDUCE_PROBE (measuring only, bench/RESULTS.md twenty-sixth session): 'one' sums the first element of
// an all-reduce and leaves the rest as each rank had it, 'skip' reduces nothing, unset sums everything, and anything
// else is an error naming the variable before any NCCL call.
TEST(NcclProcessGroup, AllReduceProbeReducesOneElementOrNoneAndRefusesAnUnknownValue) {
  if (is_rank_process()) {
    const std::string v = std::getenv("INGOT_ALL_REDUCE_PROBE") ? std::getenv("INGOT_ALL_REDUCE_PROBE") : "";
    auto ctx = init_distributed(nccl_init());
    const int r = ctx.info.rank;
    Tensor t = rank_tensor(r, 4096, DType::f32, Device(DeviceType::cuda, ctx.info.local_rank));
    if (v == "half") {
      const std::string err = error_of([&] { ctx.group->all_reduce(t, ReduceOp::Sum)->wait(10000ms); });
      EXPECT_NE(err.find("INGOT_ALL_REDUCE_PROBE must be 'one' or 'skip'"), std::string::npos) << err;
      return;
    }
    ctx.group->all_reduce(t, ReduceOp::Sum)->wait(10000ms);
    const Tensor h = t.to(Device::cpu());
    const double both0 = value(0, 0) + value(1, 0), both5 = value(0, 5) + value(1, 5);
    EXPECT_NEAR(h.item_at(0), v == "skip" ? value(r, 0) : both0, 1e-5) << "INGOT_ALL_REDUCE_PROBE='" << v << "'";
    EXPECT_NEAR(h.item_at(5), v.empty() ? both5 : value(r, 5), 1e-5) << "INGOT_ALL_REDUCE_PROBE='" << v << "'";
    return;
  }
  INGOT_REQUIRE_TWO_GPUS();
  for (const char* v : {"", "one", "skip", "half"}) {
    ingot::testing::SpawnOptions o = ingot::testing::world(2).within(60000ms);
    if (*v) o.env["INGOT_ALL_REDUCE_PROBE"] = v;
    expect_ranks_pass(spawn_ranks(o));
  }
}

TEST(NcclProcessGroup, DdpOnGpusGivesTheGradientsOfTheFullBatchOnTheCpu) {
  if (is_rank_process()) {
    auto ctx = init_distributed(nccl_init());
    const int rank = ctx.info.rank;
    Device dev(DeviceType::cuda, ctx.info.local_rank);
    manual_seed(5);
    Tensor w_cpu = randn({32, 8}), x = randn({6, 32}), y = randn({6, 8});
    Tensor w_ref = w_cpu.detach();
    w_ref.set_requires_grad(true);
    Tensor w = (rank == 0 ? w_cpu : w_cpu * 3.0).to(dev).detach();  // rank 1 starts wrong: broadcast fixes it
    w.set_requires_grad(true);
    DistributedDataParallel ddp({w}, ctx.group);
    auto idx = from_vector_i64({rank * 3, rank * 3 + 1, rank * 3 + 2}, {3});
    mse_loss(matmul(index_select(x, 0, idx).to(dev), w), index_select(y, 0, idx).to(dev)).backward();
    ddp.synchronize();
    mse_loss(matmul(x, w_ref), y).backward();
    EXPECT_LE(max_rel_error(w.grad().to(Device::cpu()), w_ref.grad(), 1e-4, 1e-6), 1.0);
    return;
  }
  INGOT_REQUIRE_TWO_GPUS();
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2).within(60000ms)));
}

TEST(NcclProcessGroup, TheWatchdogNamesTheOpSequenceAndMissingRankAndAbortsInsteadOfHanging) {
  if (is_rank_process()) {
    TempDir traces("ingot_trace");
    InitOptions o = nccl_init(1500ms);
    o.trace_dir = traces.path();
    auto ctx = init_distributed(o);
    const int rank = ctx.info.rank;
    Device dev(DeviceType::cuda, ctx.info.local_rank);
    Tensor x = rank_tensor(rank, 1024, DType::f32, dev);
    ctx.group->all_reduce(x)->wait();  // #0 with everybody
    if (rank == 1) {
      ctx.store->wait({"rank0_done"}, 30000ms);  // skips #1, stays alive until rank 0 has its error
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    std::string msg = error_of([&] { ctx.group->all_reduce(x)->wait(); });
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10000ms);
    EXPECT_NE(msg.find("all_reduce #1 failed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1500 ms timeout"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ranks that never joined it: [1]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ingot_collectives_world_rank0.json"), std::string::npos) << msg;
    EXPECT_NE(error_of([&] { ctx.group->all_reduce(x); }).find("unusable"), std::string::npos);
    ctx.store->set("rank0_done", "1");
    return;
  }
  INGOT_REQUIRE_TWO_GPUS();
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2).within(60000ms)));
}

}  // namespace
}  // namespace ingot::distributed
