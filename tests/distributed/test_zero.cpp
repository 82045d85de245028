// ZeRO-2 (DistributedDataParallel zero_stage 2) and ZeRO-3 (FullyShardedDataParallel) in eager mode over Gloo
// with 3 real processes: the same losses and weights as plain DDP and as one process, and per-rank bytes of
// weights, gradients and optimizer state about 1/world of DDP's, read from the CPU allocator.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "autograd/ops.h"
#include "distributed/bootstrap.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "distributed/sampler.h"
#include "distributed/spawn.h"
#include "models/tiny_models.h"
#include "optim/optimizer.h"
#include "runtime/allocator.h"
#include "runtime/rng.h"

namespace ingot::distributed {
namespace {

using ingot::testing::expect_ranks_pass;
using ingot::testing::is_rank_process;
using ingot::testing::spawn_ranks;

enum class Mode { OneProcess, Ddp, Zero2, Zero3, Zero3KeepAfterForward };

struct Trained {
  std::vector<double> losses;
  std::vector<Tensor> params;  // whole values after training
  int64_t held = 0;            // bytes allocated after the first step beyond what the whole model took before
  int64_t model_bytes = 0;     // bytes of the whole model (weights), allocated before wrapping
};

int64_t allocated() { return cpu_allocator().stats().allocated_bytes; }

// Tiny GPT-2 (2 blocks), AdamW, 4 steps on this rank's rows of a fixed global batch of 6 sequences, each step
// as two micro-batches (gradient accumulation); buckets of 8 KiB so DDP spreads over several.
Trained train(const DistributedContext& ctx, Mode mode) {
  const bool one = mode == Mode::OneProcess;
  const int rank = one ? 0 : ctx.info.rank, world = one ? 1 : ctx.info.world_size;
  auto [ids, tgt] = ingot::testing::repeating_batch(6, 8);
  RowRange r = batch_shard(6, rank, world);
  const int64_t rows = r.end - r.begin, half = rows / 2;
  std::vector<std::pair<Tensor, Tensor>> micro;
  for (int64_t m = 0; m < 2; ++m) {
    const int64_t at = r.begin + m * half, n = m == 0 ? half : rows - half;
    micro.emplace_back(contiguous(narrow(ids, 0, at, n)), contiguous(narrow(tgt, 0, at, n)));
  }
  manual_seed(5);
  models::GPT2 model(ingot::testing::tiny_gpt2_config());
  Trained out;
  const int64_t base = allocated();
  for (const Tensor& p : model.parameters()) out.model_bytes += static_cast<int64_t>(p.nbytes());
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<FullyShardedDataParallel> fsdp;
  if (mode == Mode::Ddp || mode == Mode::Zero2) {
    DdpOptions o;
    o.bucket_cap_mb = 8.0 / 1024;
    o.zero_stage = mode == Mode::Zero2 ? 2 : 0;
    ddp = std::make_unique<DistributedDataParallel>(model, ctx.group, o);
  } else if (!one) {
    FsdpOptions o;
    o.reshard_after_forward = mode == Mode::Zero3;
    fsdp = std::make_unique<FullyShardedDataParallel>(model, ctx.group, o);
  }
  optim::AdamW opt(ddp ? ddp->optimizer_params() : fsdp ? fsdp->optimizer_params() : model.parameters(),
                   optim::AdamWOptions{3e-3, 0.9, 0.95, 1e-8, 0.1});
  for (int step = 0; step < 4; ++step) {
    double loss = 0;
    for (size_t m = 0; m < micro.size(); ++m) {
      const double weight = static_cast<double>(micro[m].first.size(0)) / static_cast<double>(rows);
      Tensor l = model.loss(micro[m].first, micro[m].second) * weight;
      if (ddp && m == 0) {
        auto guard = ddp->no_sync();
        l.backward();
      } else {
        l.backward();
      }
      if (fsdp) fsdp->synchronize();  // every FSDP backward reduces; the averages add up in the shards' .grad
      loss += l.item();
    }
    if (ddp) ddp->step(opt);
    else opt.step();
    if (step == 0) out.held = allocated() - base;
    if (ddp) ddp->zero_grad();
    else if (fsdp) fsdp->zero_grad();
    else model.zero_grad();
    out.losses.push_back(world > 1 ? loss / world : loss);
  }
  if (world > 1) {  // the global mean loss: each rank's is the mean over its equal share
    Tensor t = from_vector(out.losses, {static_cast<int64_t>(out.losses.size())}, DType::f64);
    ctx.group->all_reduce(t, ReduceOp::Sum)->wait();
    out.losses = t.to_vector();
  }
  if (fsdp) fsdp->unshard();
  for (const Tensor& p : model.parameters()) out.params.push_back(p.clone_raw());
  return out;
}

void expect_same_training(const Trained& a, const Trained& b, const char* what, bool weights = true) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], b.losses[i], 2e-5 * std::abs(b.losses[i])) << what << ", step " << i;
  if (!weights) return;
  for (size_t k = 0; k < a.params.size(); ++k)
    EXPECT_LE(max_rel_error(a.params[k], b.params[k], 1e-4, 1e-5), 1.0) << what << ", parameter " << k;
}

// Tolerance: f32 sums of the same numbers in another order (reduce-scatter chunks vs all-reduce, one process's
// whole batch vs per-rank means), 2e-5 relative on the loss; the weights of the data-parallel runs within 1e-4
// of each other after 4 AdamW steps (against one process only the losses: AdamW divides gradients that are ~0
// by their own magnitude, which turns the rounding of a different summation order into whole steps of lr).
TEST(ZeroStages, TwoAndThreeTrainLikeDdpAndOneProcessWithAboutOneNthOfTheBytes) {
  if (is_rank_process()) {
    auto ctx = init_distributed(ingot::testing::gloo_test_init());
    const int world = ctx.info.world_size;
    Trained single = train(ctx, Mode::OneProcess), ddp = train(ctx, Mode::Ddp), zero2 = train(ctx, Mode::Zero2),
        zero3 = train(ctx, Mode::Zero3), keep = train(ctx, Mode::Zero3KeepAfterForward);
    EXPECT_LT(single.losses.back(), single.losses.front() - 0.2) << "the run must actually train";
    expect_same_training(ddp, single, "DDP vs one process", false);
    expect_same_training(zero3, single, "ZeRO-3 vs one process", false);
    expect_same_training(zero2, ddp, "ZeRO-2 vs DDP");
    expect_same_training(zero3, ddp, "ZeRO-3 vs DDP");
    expect_same_training(keep, zero3, "ZeRO-3 without resharding after forward vs with");
    // DDP holds, beside the weights, the gradients, its buckets and AdamW's two moments: ~4x the weights.
    // ZeRO-2 holds a 1/world shard of each (weights stay whole): ~4/world. ZeRO-3 holds nothing whole: its
    // weights, gradients and moments (~4/world of the model) against DDP's ~5x the weights in all.
    const double m = static_cast<double>(ddp.model_bytes), n = static_cast<double>(world);
    const double ddp_total = m + static_cast<double>(ddp.held), zero3_total = m + static_cast<double>(zero3.held);
    std::printf("[ zero     ] world %d: model %.0f B; held beyond it: DDP %lld, ZeRO-2 %lld; total with weights: DDP "
                "%.0f, ZeRO-3 %.0f\n",
                world, m, static_cast<long long>(ddp.held), static_cast<long long>(zero2.held), ddp_total, zero3_total);
    EXPECT_GT(static_cast<double>(ddp.held), 3.9 * m);
    EXPECT_LT(static_cast<double>(zero2.held), 1.1 * static_cast<double>(ddp.held) / n);
    EXPECT_GT(static_cast<double>(zero2.held), 0.9 * static_cast<double>(ddp.held) / n);
    EXPECT_LT(zero3_total, 1.0 * ddp_total / n);
    EXPECT_GT(zero3_total, 0.7 * ddp_total / n);
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(3).within(std::chrono::seconds(60))));
}

// The unit protocol, counted in collectives: a step of the 2-block model all-gathers the root once and each
// block twice (before its forward and again before its backward), or once with reshard_after_forward false,
// and reduce-scatters each of the 3 units once. Outside forward and backward no weight has bytes; a forward
// without gradients (eval) frees every unit again and gives the loss of the whole model.
TEST(ZeroStages, ThreeGathersEachUnitBeforeUseAndFreesItAfter) {
  if (is_rank_process()) {
    auto ctx = init_distributed(ingot::testing::gloo_test_init());
    auto [ids, tgt] = ingot::testing::repeating_batch(2, 8);
    manual_seed(5);
    models::GPT2 whole(ingot::testing::tiny_gpt2_config());
    double eval_loss = 0;
    {
      NoGradGuard no_grad;
      eval_loss = whole.loss(ids, tgt).item();
    }
    for (bool reshard : {true, false}) {
      manual_seed(5);
      models::GPT2 model(ingot::testing::tiny_gpt2_config());
      FsdpOptions o;
      o.reshard_after_forward = reshard;
      FullyShardedDataParallel fsdp(model, ctx.group, o);
      ASSERT_EQ(fsdp.layout().size(), 3u) << "root + 2 blocks";
      auto all_freed = [&] {
        for (const Tensor& p : model.parameters())
          if (p.data_ptr() != nullptr) return false;
        return true;
      };
      EXPECT_TRUE(all_freed());
      const int64_t before = ctx.group->next_seq();
      model.loss(ids, tgt).backward();
      fsdp.synchronize();
      EXPECT_EQ(ctx.group->next_seq() - before, reshard ? 1 + 2 * 2 + 3 : 1 + 2 + 3) << "reshard " << reshard;
      EXPECT_TRUE(all_freed());
      double l = 0;
      {
        NoGradGuard no_grad;
        l = model.loss(ids, tgt).item();
      }
      EXPECT_TRUE(all_freed()) << "eval leaves nothing gathered";
      EXPECT_NEAR(l, eval_loss, 1e-6 * std::abs(eval_loss));
    }
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2)));
}

}  // namespace
}  // namespace ingot::distributed
