// DistributedDataParallel inside a compiled step: the gradient all-reduces are graph nodes of the one traced
// graph (Note [DDP in a traced step], distributed/ddp.cpp), and training follows eager DDP step for step.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "compile/api.h"
#include "distributed/bootstrap.h"
#include "distributed/ddp.h"
#include "distributed/compiled_ranks.h"
#include "distributed/sampler.h"
#include "models/tiny_models.h"
#include "optim/optimizer.h"
#include "runtime/file_util.h"
#include "runtime/rng.h"
#include "tests/testing.h"

namespace ingot::distributed {
namespace {

using namespace std::chrono_literals;
using ingot::testing::count_occurrences;
using ingot::testing::is_rank_process;
using ingot::testing::join_compiled_ranks;
using ingot::testing::run_compiled_ranks;

// Longer timeouts than the other DDP tests: each rank compiles the step (g++) before its first collective.
constexpr auto kRankTimeout = 20s;

struct DdpRun {
  std::vector<double> losses;
  std::vector<Tensor> params;
  CompileStats stats;
  size_t buckets = 0;
  int64_t collectives = 0;  // issued to the process group from DDP's construction to the last step
};

// Tiny GPT-2, AdamW, 6 steps on this rank's half of a fixed global batch of 4 sequences; small buckets so
// the model spreads over several all-reduces. `wrap` false: the same steps without DDP (one process's step).
DdpRun train(const DistributedContext& ctx, bool compiled, const std::string& cache_dir, int zero_stage = 0,
             std::optional<DType> reduce_dtype = std::nullopt, bool wrap = true) {
  manual_seed(5);
  models::GPT2 model(ingot::testing::tiny_gpt2_config());
  DdpOptions o;
  o.bucket_cap_mb = 8.0 / 1024;  // 8 KiB: a handful of buckets
  o.zero_stage = zero_stage;
  o.reduce_dtype = reduce_dtype;
  const int64_t seq0 = ctx.group->next_seq();
  std::unique_ptr<DistributedDataParallel> ddp;
  if (wrap) ddp = std::make_unique<DistributedDataParallel>(model, ctx.group, o);
  optim::AdamW opt(ddp ? ddp->optimizer_params() : model.parameters(),
                   optim::AdamWOptions{3e-3, 0.9, 0.95, 1e-8, 0.1});
  auto [ids, tgt] = ingot::testing::repeating_batch(4, 8);
  RowRange r = batch_shard(4, ctx.info.rank, ctx.info.world_size);
  Tensor x = contiguous(narrow(ids, 0, r.begin, r.end - r.begin));
  Tensor y = contiguous(narrow(tgt, 0, r.begin, r.end - r.begin));
  auto step = [&](const std::vector<Tensor>& b) {
    Tensor loss = model.loss(b[0], b[1]);
    loss.backward();
    step_and_zero_grad(ddp.get(), opt);
    return std::vector<Tensor>{loss};
  };
  CompileOptions co;
  co.cache_dir = cache_dir;
  co.bucket_updates = true;  // one update per bucket: exact here (Gloo), opt-in on GPUs (compile/api.h)
  CompiledFunction fn = compile(step, co);
  DdpRun out;
  for (int i = 0; i < 6; ++i) out.losses.push_back((compiled ? fn({x, y}) : step({x, y}))[0].item());
  for (const Tensor& p : model.parameters()) out.params.push_back(p.clone_raw());
  out.stats = fn.stats();
  out.buckets = ddp ? ddp->bucket_layout().size() : 0;
  out.collectives = ctx.group->next_seq() - seq0;
  return out;
}

TEST(CompiledDdp, AllReducesAreGraphNodesAndTrainingFollowsEagerDdp) {
  if (is_rank_process()) {
    const auto [ctx, cache] = join_compiled_ranks(kRankTimeout);
    DdpRun eager = train(ctx, false, cache), comp = train(ctx, true, cache);
    ASSERT_GT(eager.buckets, 2u) << "the test needs several buckets";
    for (size_t i = 0; i < eager.losses.size(); ++i)
      EXPECT_NEAR(comp.losses[i], eager.losses[i], 1e-4 * std::abs(eager.losses[i])) << "step " << i;
    for (size_t k = 0; k < eager.params.size(); ++k)
      EXPECT_LE(max_rel_error(comp.params[k], eager.params[k], 1e-3, 1e-4), 1.0) << "parameter " << k;
    EXPECT_LT(eager.losses.back(), eager.losses.front() - 0.3) << "the run must actually train";
    EXPECT_EQ(comp.stats.compiles, 1);
    EXPECT_TRUE(comp.stats.graph_breaks.empty());
    const std::string& g = comp.stats.last_graph;
    auto positions = [&](const std::string& what) {
      std::vector<size_t> at;
      for (size_t p = g.find(what); p != std::string::npos; p = g.find(what, p + 1)) at.push_back(p);
      return at;
    };
    const std::vector<size_t> starts = positions("all_reduce_start("), waits = positions("collective_wait("),
                              matmuls = positions("matmul(");
    EXPECT_EQ(starts.size(), eager.buckets) << "one all-reduce node per bucket in the compiled graph";
    EXPECT_EQ(waits.size(), eager.buckets);
    // Overlap: the first bucket is issued before the backward's last matmul, and the first wait comes after it.
    ASSERT_FALSE(starts.empty() || waits.empty() || matmuls.empty());
    EXPECT_LT(starts.front(), matmuls.back()) << g;
    EXPECT_GT(waits.front(), matmuls.back()) << g;
    // One update per bucket (compile/passes/bucket_updates.cpp), each after its own wait: the first update runs
    // before the last wait, so the early buckets' updates overlap the later buckets' reductions.
    const std::vector<size_t> updates = positions("adamw_update(");
    EXPECT_EQ(updates.size(), eager.buckets) << g;
    ASSERT_FALSE(updates.empty());
    EXPECT_LT(updates.front(), waits.back()) << g;
    EXPECT_GT(comp.stats.kernels, 0) << "fused groups run as generated kernels";
    std::printf("[ ddp      ] rank %d: %zu buckets, %lld launches, %lld generated kernels (%lld compiled here)\n",
                ctx.info.rank, eager.buckets, static_cast<long long>(comp.stats.launches),
                static_cast<long long>(comp.stats.kernels), static_cast<long long>(comp.stats.kernels_generated));
    return;
  }
  run_compiled_ranks(2, 120s);
}

// ZeRO-1 compiled: a reduce_scatter_start node per bucket feeds this rank's shard update, an all_gather_start
// node per bucket writes the parameters back, each with its collective_wait; the run follows eager ZeRO-1.
// ZeRO-2 traces the very same graph: in a compiled step the whole gradients and the bucket concatenations are
// graph values that the memory plan frees after their last reader (the concatenation, the reduce-scatter),
// so compiled ZeRO-1 already is ZeRO-2 in memory terms; only eager DDP keeps them whole between steps.
TEST(CompiledDdp, ZeroOneAndTwoReduceScatterAndAllGatherInTheGraphLikeEager) {
  if (is_rank_process()) {
    const auto [ctx, cache] = join_compiled_ranks(kRankTimeout);
    DdpRun eager = train(ctx, false, cache, 1), comp = train(ctx, true, cache, 1);
    DdpRun eager2 = train(ctx, false, cache, 2), comp2 = train(ctx, true, cache, 2);
    for (size_t i = 0; i < eager.losses.size(); ++i) {
      EXPECT_NEAR(comp.losses[i], eager.losses[i], 1e-4 * std::abs(eager.losses[i])) << "step " << i;
      EXPECT_NEAR(eager2.losses[i], eager.losses[i], 1e-6 * std::abs(eager.losses[i])) << "step " << i;
      EXPECT_NEAR(comp2.losses[i], eager2.losses[i], 1e-4 * std::abs(eager2.losses[i])) << "step " << i;
    }
    for (size_t k = 0; k < eager.params.size(); ++k) {
      EXPECT_LE(max_rel_error(comp.params[k], eager.params[k], 1e-3, 1e-4), 1.0) << "parameter " << k;
      EXPECT_LE(max_rel_error(comp2.params[k], eager2.params[k], 1e-3, 1e-4), 1.0) << "parameter " << k;
    }
    EXPECT_LT(eager.losses.back(), eager.losses.front() - 0.3) << "the run must actually train";
    EXPECT_TRUE(comp.stats.graph_breaks.empty());
    const std::string& g = comp.stats.last_graph;
    auto count = [&](const std::string& what) { return count_occurrences(g, what); };
    EXPECT_EQ(count("reduce_scatter_start("), eager.buckets);
    EXPECT_EQ(count("all_gather_start("), eager.buckets);
    EXPECT_EQ(count("collective_wait("), 2 * eager.buckets);
    EXPECT_EQ(count("all_reduce_start("), 0u);
    // The same graph (its "grad" lines list the parameters in no fixed order), and no whole gradient outlives
    // the step: every parameter's .grad is none afterwards.
    const std::string& g2 = comp2.stats.last_graph;
    EXPECT_EQ(g2.substr(0, g2.find("\n  grad ")), g.substr(0, g.find("\n  grad "))) << "stage 2 traces stage 1's graph";
    EXPECT_EQ(count("\n  grad "), eager.params.size());
    EXPECT_EQ(count("\n  grad none -> "), eager.params.size()) << g;
    return;
  }
  run_compiled_ranks(2, 120s);
}

// distributed.reduce_dtype bf16: gradients rounded to bf16 before the reduction (half the bytes) and widened
// back for the optimizer. Compiled follows eager exactly; both stay within bf16's rounding of f32 reduction.
TEST(CompiledDdp, Bf16ReductionFollowsEagerAndStaysNearTheF32Reduction) {
  if (is_rank_process()) {
    const auto [ctx, cache] = join_compiled_ranks(kRankTimeout);
    DdpRun f32 = train(ctx, false, cache), eager = train(ctx, false, cache, 0, DType::bf16),
           comp = train(ctx, true, cache, 0, DType::bf16);
    for (size_t i = 0; i < eager.losses.size(); ++i) {
      EXPECT_NEAR(comp.losses[i], eager.losses[i], 1e-4 * std::abs(eager.losses[i])) << "step " << i;
      EXPECT_NEAR(eager.losses[i], f32.losses[i], 1e-2 * std::abs(f32.losses[i])) << "step " << i;
    }
    bool differs = false;
    for (size_t k = 0; k < eager.params.size(); ++k) {
      EXPECT_LE(max_rel_error(comp.params[k], eager.params[k], 1e-3, 1e-4), 1.0) << "parameter " << k;
      differs = differs || max_rel_error(eager.params[k], f32.params[k], 1e-7, 1e-9) > 1.0;
    }
    EXPECT_TRUE(differs) << "the bf16 reduction must round something (else this test checks nothing)";
    const std::string& g = comp.stats.last_graph;
    EXPECT_NE(g.find("all_reduce_start(") , std::string::npos);
    EXPECT_NE(g.find("bf16"), std::string::npos) << "the buckets are reduced in bf16: " << g;
    // Note [Narrow gradients read by the update]: AdamW reads slices of each bf16 average; no cast widens it first.
    size_t waits = 0;
    for (size_t at = g.find("= collective_wait("); at != std::string::npos; at = g.find("= collective_wait(", at + 1)) {
      const size_t line = g.rfind('%', g.rfind(':', at));
      const std::string id = g.substr(line, g.find(':', line) - line);
      EXPECT_EQ(g.find("cast(" + id + ")"), std::string::npos) << id << " is widened before the update:\n" << g;
      ++waits;
    }
    EXPECT_GT(waits, 0u) << g;
    return;
  }
  run_compiled_ranks(2, 120s);
}

// Note [Averages over one rank] (distributed/collective_ops.cpp): in a world of one a compiled DDP step issues no
// all-reduce (NCCL would read and write every bucket to multiply it by 1), yet keeps the data-parallel graph (a
// start and a wait per bucket, per-bucket updates) and trains exactly as the step without DDP.
TEST(CompiledDdp, AWorldOfOneIssuesNoReductionAndTrainsLikeOneProcess) {
  if (is_rank_process()) {
    const auto [ctx, cache] = join_compiled_ranks(kRankTimeout);
    ASSERT_EQ(ctx.info.world_size, 1);
    DdpRun alone = train(ctx, true, cache, 0, std::nullopt, false), comp = train(ctx, true, cache);
    ASSERT_GT(comp.buckets, 2u) << "the test needs several buckets";
    EXPECT_EQ(comp.collectives, 0) << "the traced and the compiled steps issued collectives in a world of one";
    for (size_t i = 0; i < alone.losses.size(); ++i) EXPECT_EQ(comp.losses[i], alone.losses[i]) << "step " << i;
    for (size_t k = 0; k < alone.params.size(); ++k)
      EXPECT_LE(max_rel_error(comp.params[k], alone.params[k], 1e-6, 1e-7), 1.0) << "parameter " << k;
    EXPECT_LT(alone.losses.back(), alone.losses.front() - 0.3) << "the run must actually train";
    const std::string& g = comp.stats.last_graph;
    auto count = [&](const std::string& what) { return count_occurrences(g, what); };
    EXPECT_EQ(count("all_reduce_start("), comp.buckets) << g;
    EXPECT_EQ(count("collective_wait("), comp.buckets) << g;
    EXPECT_EQ(count("adamw_update("), comp.buckets) << g;
    return;
  }
  run_compiled_ranks(1, 120s);
}

}  // namespace
}  // namespace ingot::distributed
