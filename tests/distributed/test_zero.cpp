// ZeRO-2 (DistributedDataParallel zero_stage 2) and ZeRO-3 (FullyShardedDataParallel) in eager mode over Gloo
// with 2-4 real processes: the same losses and weights as plain DDP and as one process, and per-rank bytes of
// weights, gradients and optimizer state about 1/world of DDP's, read from the CPU allocator. ZeRO-3: the
// embeddings and the head are units gathered only where used, and a model built without bytes is sharded one
// unit at a time. ZeRO-1, 2 and 3: an f32 reduction reaches f32 masters unrounded, eager and compiled.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>

#include "autograd/nn/layers.h"
#include "autograd/ops.h"
#include "compile/api.h"
#include "distributed/bootstrap.h"
#include "distributed/buckets.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "distributed/sampler.h"
#include "distributed/spawn.h"
#include "models/decoder.h"
#include "models/tiny_models.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "runtime/allocator.h"
#include "runtime/rng.h"
#include "tests/testing.h"

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
    EXPECT_LE(max_rel_error(a.params[k], b.params[k], 2e-4, 2e-5), 1.0) << what << ", parameter " << k;
}

// Tolerance: f32 sums of the same numbers in another order (reduce-scatter chunks vs all-reduce, one process's
// whole batch vs per-rank means), 2e-5 relative on the loss; the weights of the data-parallel runs within 2e-4
// of each other after 4 AdamW steps (OpenBLAS's Sandybridge kernels, which it picks on some Xeons, put one element
// of ZeRO-3's 1.3e-4 from DDP's where its SkylakeX kernels on the same machine stay within 1e-4; a wrong reduction
// moves weights by ~lr = 3e-3); against one process only the losses (AdamW divides gradients that are ~0 by their
// own magnitude, which turns the rounding of a different summation order into whole steps of lr).
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

// The unit protocol, counted in collectives: a step of the 2-block model all-gathers the embeddings once, each
// block twice (before its forward and again before its backward), or once with reshard_after_forward false (the
// last block alone once with keep_last_blocks 1), the head once and the tied embeddings once more for the head,
// and reduce-scatters each of the 4 units once. Outside forward and backward no weight has bytes; a forward
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
    // keep: FsdpOptions::keep_last_blocks (Note [The last blocks kept]): the last block is gathered once.
    for (const auto& [reshard, keep] : {std::pair{true, 0}, std::pair{false, 0}, std::pair{true, 1}}) {
      SCOPED_TRACE("reshard " + std::to_string(reshard) + ", keep_last_blocks " + std::to_string(keep));
      manual_seed(5);
      models::GPT2 model(ingot::testing::tiny_gpt2_config());
      FsdpOptions o;
      o.reshard_after_forward = reshard;
      o.keep_last_blocks = keep;
      FullyShardedDataParallel fsdp(model, ctx.group, o);
      ASSERT_EQ(fsdp.layout().size(), 4u) << "embeddings + 2 blocks + head";
      auto all_freed = [&] {
        for (const Tensor& p : model.parameters())
          if (p.data_ptr() != nullptr) return false;
        return true;
      };
      EXPECT_TRUE(all_freed());
      const int64_t before = ctx.group->next_seq();
      model.loss(ids, tgt).backward();
      fsdp.synchronize();
      // Gathers: the embeddings, each block (twice when resharding), the head and the tied embeddings again for
      // it; one reduce-scatter per unit.
      EXPECT_EQ(ctx.group->next_seq() - before, 1 + (reshard ? 2 * 2 - keep : 2) + 2 + 4);
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


int64_t unit_bytes(const BucketPlan& p) { return p.padded_numel * static_cast<int64_t>(itemsize(p.dtype)); }

// This rank's rows of a fixed global batch of 4 sequences.
std::pair<Tensor, Tensor> rank_rows(const DistributedContext& ctx, bool one) {
  auto [ids, tgt] = ingot::testing::repeating_batch(4, 8);
  if (one) return {ids, tgt};
  const RowRange r = batch_shard(4, ctx.info.rank, ctx.info.world_size);
  return {contiguous(narrow(ids, 0, r.begin, r.end - r.begin)), contiguous(narrow(tgt, 0, r.begin, r.end - r.begin))};
}

// The global batch's mean loss of 3 AdamW steps: one process on the whole batch (fsdp null), or ZeRO-3 through
// `fsdp` (wrapping `model`) on this rank's rows.
std::vector<double> three_steps(const DistributedContext& ctx, models::CausalLM& model, FullyShardedDataParallel* fsdp) {
  auto [ids, tgt] = rank_rows(ctx, fsdp == nullptr);
  optim::AdamW opt(fsdp ? fsdp->optimizer_params() : model.parameters(), optim::AdamWOptions{3e-3, 0.9, 0.95, 1e-8, 0.1});
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) {
    Tensor l = model.loss(ids, tgt);
    l.backward();
    if (fsdp) fsdp->synchronize();
    opt.step();
    opt.zero_grad();
    if (fsdp) fsdp->zero_grad();
    double v = l.item();
    if (fsdp) {
      Tensor t = from_vector(std::vector<double>{v}, {1}, DType::f64);
      ctx.group->all_reduce(t, ReduceOp::Avg)->wait();
      v = t.item();
    }
    losses.push_back(v);
  }
  return losses;
}

// A tiny GPT-2 (tied embeddings) or Llama (an lm_head of its own), made from the same seed every time.
std::unique_ptr<models::CausalLM> tiny_causal_lm(bool tied) {
  manual_seed(5);
  if (tied) return std::make_unique<models::GPT2>(ingot::testing::tiny_gpt2_config());
  return std::make_unique<models::Llama>(ingot::testing::tiny_llama_config());
}

// Three steps of `model` under `fsdp` (its gathered-bytes peak reset first), expected to give the losses of one
// process training a fresh copy (2e-5 relative, as above); returns how many collectives the sharded steps issued.
int64_t expect_one_process_losses(const DistributedContext& ctx, bool tied, models::CausalLM& model,
                                  FullyShardedDataParallel& fsdp) {
  const std::vector<double> single = three_steps(ctx, *tiny_causal_lm(tied), nullptr);
  fsdp.reset_peaks();
  const int64_t before = ctx.group->next_seq();
  const std::vector<double> sharded = three_steps(ctx, model, &fsdp);
  const int64_t issued = ctx.group->next_seq() - before;
  for (size_t i = 0; i < single.size(); ++i)
    EXPECT_NEAR(sharded[i], single[i], 2e-5 * std::abs(single[i])) << "step " << i;
  return issued;
}

// Note [Embeddings and head are units] (fsdp.h): GPT-2 (tied: its head multiplies by wte) and Llama (an lm_head
// of its own) each get an embeddings unit, a unit per block and a head unit. A step then holds at most one block's
// weights, or the head's with (tied) the embeddings, gathered at once: the unit accounting's peak is exactly that,
// below the old root unit (embeddings + head, gathered all step) beside a block. Losses as one process's (2e-5
// relative, as above).
TEST(ZeroStages, ThreeGathersTheEmbeddingsAndTheHeadOnlyWhereTheyAreUsed) {
  if (is_rank_process()) {
    auto ctx = init_distributed(ingot::testing::gloo_test_init());
    for (const bool tied : {true, false}) {
      SCOPED_TRACE(tied ? "GPT-2 (tied embeddings)" : "Llama (lm_head of its own)");
      std::unique_ptr<models::CausalLM> model = tiny_causal_lm(tied);
      FsdpOptions o;
      o.prefetch = false;  // one unit gathered at a time (with prefetch two blocks: the test below)
      FullyShardedDataParallel fsdp(*model, ctx.group, o);
      expect_one_process_losses(ctx, tied, *model, fsdp);
      const int64_t peak = fsdp.peak_gathered_bytes();
      const std::vector<BucketPlan>& plans = fsdp.layout();
      ASSERT_EQ(plans.size(), 4u) << "embeddings, 2 blocks, head";
      const int64_t embed = unit_bytes(plans.front()), head = unit_bytes(plans.back());
      const int64_t block = std::max(unit_bytes(plans[1]), unit_bytes(plans[2]));
      const int64_t expected = tied ? std::max(block, embed + head) : std::max({embed, block, head});
      if (ctx.info.rank == 0)
        std::printf("[ zero     ] %s: units embeddings %lld B, block %lld B, head %lld B; gathered at once at most "
                    "%lld B (a root unit beside a block: %lld B)\n",
                    tied ? "gpt2" : "llama", static_cast<long long>(embed), static_cast<long long>(block),
                    static_cast<long long>(head), static_cast<long long>(peak),
                    static_cast<long long>(embed + head + block));
      EXPECT_EQ(peak, expected);
      EXPECT_LT(peak, embed + head + block);
    }
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2)));
}

// Note [Eager prefetch] (fsdp.h): with prefetch each block's gather is issued while the block before it (forward)
// or after it (backward) computes. The losses stay those of one process, a step issues the same collectives as
// without it (one unit's gather only moves earlier), at most two blocks' weights are gathered at once (or the
// head with the tied embeddings), and an eval forward, which prefetches too, leaves nothing gathered.
TEST(ZeroStages, PrefetchedBlocksTrainLikeOneProcessWithTwoBlocksGatheredAtOnce) {
  if (is_rank_process()) {
    auto ctx = init_distributed(ingot::testing::gloo_test_init());
    for (const bool tied : {true, false}) {
      SCOPED_TRACE(tied ? "GPT-2 (tied embeddings)" : "Llama (lm_head of its own)");
      std::unique_ptr<models::CausalLM> model = tiny_causal_lm(tied);
      FsdpOptions o;
      o.prefetch = true;
      FullyShardedDataParallel fsdp(*model, ctx.group, o);
      // Per step: the embeddings, each block twice, the head (tied: the embeddings again) and 4 reduce-scatters,
      // plus the loss's all-reduce in three_steps. Llama's untied table is looked up where its rows lie (Note
      // [Vocabulary-parallel embeddings], fsdp.h): the ids' all-gather, the rows' sum reduce-scatter and the
      // gradient's all-gather instead of the table's gather and reduce-scatter.
      EXPECT_EQ(expect_one_process_losses(ctx, tied, *model, fsdp),
                3 * ((tied ? 1 + 2 * 2 + 2 + 4 : 1 + 2 * 2 + 1 + 1 + 3 + 1) + 1));
      const int64_t peak = fsdp.peak_gathered_bytes();
      const std::vector<BucketPlan>& plans = fsdp.layout();
      ASSERT_EQ(plans.size(), 4u) << "embeddings, 2 blocks, head";
      const int64_t embed = unit_bytes(plans.front()), head = unit_bytes(plans.back());
      const int64_t blocks = unit_bytes(plans[1]) + unit_bytes(plans[2]);
      EXPECT_EQ(peak, tied ? std::max(blocks, embed + head) : std::max({embed, blocks, head}));
      auto [ids, tgt] = ingot::testing::repeating_batch(2, 8);
      {
        NoGradGuard no_grad;
        model->loss(ids, tgt);
      }
      for (const Tensor& p : model->parameters()) EXPECT_EQ(p.data_ptr(), nullptr) << "eval leaves nothing gathered";
    }
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2)));
}

// Three GPT-2-style blocks and nothing else (every unit a block); forward runs the first `n`, the first of them
// without gradients when asked.
class PartialStack : public nn::Module {
 public:
  PartialStack() {
    auto list = register_module("layers", std::make_shared<nn::ModuleList>());
    models::DecoderConfig c;
    c.dim = 16;
    c.n_head = 2;
    c.intermediate = 32;
    for (int i = 0; i < 3; ++i) blocks_.push_back(list->append(std::make_shared<models::DecoderBlock>(c)));
  }
  Tensor forward(const Tensor& x, size_t n, bool first_without_grad) {
    return with_forward_hooks([&] {
      Tensor h = x;
      for (size_t i = 0; i < n; ++i) {
        if (i == 0 && first_without_grad) {
          NoGradGuard no_grad;
          h = blocks_[i]->forward(h);
        } else {
          h = blocks_[i]->forward(h);
        }
      }
      return h;
    });
  }

 private:
  std::vector<std::shared_ptr<models::DecoderBlock>> blocks_;
};

// Note [Eager prefetch]: a prefetch its pass does not use is freed, and a backward prefetches only blocks whose
// boundary is pending. A forward through 2 of 3 blocks prefetches the third (one gather more than without
// prefetch) and frees it when the forward ends; a first block run without gradients has no boundary, so the
// backward gathers nothing for it (the same collectives as without prefetch). Either way nothing is left gathered
// and the shards' gradients are those of the run without prefetch.
TEST(ZeroStages, PrefetchesTheirPassDoesNotUseAreFreed) {
  if (is_rank_process()) {
    auto ctx = init_distributed(ingot::testing::gloo_test_init());
    struct Run {
      std::vector<Tensor> grads;
      int64_t collectives = 0;
    };
    auto run = [&](bool prefetch, size_t n, bool first_without_grad) {
      manual_seed(7);
      PartialStack model;
      FsdpOptions o;
      o.prefetch = prefetch;
      FullyShardedDataParallel fsdp(model, ctx.group, o);
      auto all_freed = [&] {
        for (const Tensor& p : model.parameters())
          if (p.data_ptr() != nullptr) return false;
        return true;
      };
      manual_seed(8 + static_cast<uint64_t>(ctx.info.rank));
      const Tensor x = randn({2, 4, 16});
      const int64_t before = ctx.group->next_seq();
      Tensor out = model.forward(x, n, first_without_grad);
      EXPECT_TRUE(all_freed()) << "after the forward (prefetch " << prefetch << ", " << n << " blocks)";
      sum(mul(out, out)).backward();
      fsdp.synchronize();
      EXPECT_TRUE(all_freed()) << "after the backward (prefetch " << prefetch << ", " << n << " blocks)";
      Run r;
      r.collectives = ctx.group->next_seq() - before;
      for (const Tensor& p : fsdp.optimizer_params()) r.grads.push_back(p.grad().clone_raw());
      return r;
    };
    for (const auto& [n, first_without_grad] : std::vector<std::pair<size_t, bool>>{{2, false}, {3, true}}) {
      SCOPED_TRACE(std::to_string(n) + " blocks" + (first_without_grad ? ", the first without gradients" : ""));
      const Run plain = run(false, n, first_without_grad), pre = run(true, n, first_without_grad);
      EXPECT_EQ(pre.collectives, plain.collectives + (n < 3 ? 1 : 0));
      ASSERT_EQ(pre.grads.size(), plain.grads.size());
      for (size_t k = 0; k < plain.grads.size(); ++k)
        EXPECT_LE(max_rel_error(pre.grads[k], plain.grads[k], 1e-6, 1e-7), 1.0) << "unit " << k;
    }
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2)));
}

// Note [Reduced gradients keep their precision] (fsdp.h): bf16 weights, gradients reduced in f32, f32 masters
// updated by SGD with lr 1 (the update is the gradient itself). The reference is the f32 mean of every rank's bf16
// gradients of the same weights on its rows (a plain model per rank, an f32 all-reduce): the masters after the
// step are the masters minus it (1e-6 of the gradient's largest element), eagerly and compiled (node by node),
// while the masters minus its bf16 rounding, which the shards' .grad used to hold, are far from that. ZeRO-3
// compares whole parameters gathered from the masters on rank 0; ZeRO-1/2 (DistributedDataParallel, whose shards
// are chunks of gradient buckets) compare each rank's chunk of the reference laid out as the buckets.

// Runs `step` once on `batch`: traced and run node by node (compiled) or eagerly.
void run_step_once(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& step,
                   const std::vector<Tensor>& batch, bool compiled) {
  CompileOptions co;
  co.backend = CompileBackend::Eager;
  CompiledFunction fn = compile(step, co);
  if (compiled) fn(batch);
  else step(batch);
}

// The masters moved from `was` to `now` where `was - g` is wanted: how far they are from it, and how far the bf16
// rounding of g would put them, both relative to g's largest element (maxima kept in `worst`, `rounded`).
void measure_move(const Tensor& was, const Tensor& now, const Tensor& g, double& worst, double& rounded) {
  const Tensor want = sub(was, g), old_path = sub(was, g.to(DType::bf16).to(DType::f32));
  const double scale = std::max(1e-12, amax(abs(g)).item());
  worst = std::max(worst, amax(abs(sub(now, want))).item() / scale);
  rounded = std::max(rounded, amax(abs(sub(old_path, want))).item() / scale);
}

// This rank's chunk of each bucket of the f32 gradients `grads` (model.parameters() order), as ZeRO-1/2 shard them.
std::vector<Tensor> bucket_chunks(const std::vector<Tensor>& grads, double cap_mb, const DistributedContext& ctx) {
  std::vector<BucketParam> infos;
  for (const Tensor& g : grads) infos.push_back({g.numel(), DType::bf16});  // the weights' dtype plans the buckets
  std::vector<Tensor> chunks;
  for (const BucketPlan& plan : plan_buckets(infos, cap_mb * 1024 * 1024, ctx.info.world_size)) {
    Tensor flat = zeros({plan.padded_numel}, DType::f32, Device::cpu());
    for (size_t k = 0; k < plan.params.size(); ++k) {
      const Tensor& g = grads[plan.params[k]];
      flat.as_strided(g.shape(), contiguous_strides(g.shape()), plan.offsets[k]).copy_(g);
    }
    const int64_t chunk = plan.padded_numel / ctx.info.world_size;
    chunks.push_back(contiguous(narrow(flat, 0, ctx.info.rank * chunk, chunk)));
  }
  return chunks;
}

void f32_gradients_reach_the_masters(const DistributedContext& ctx, int stage) {
  auto [ids, tgt] = rank_rows(ctx, false);
  auto build = [] {
    manual_seed(5);
    auto m = std::make_unique<models::GPT2>(ingot::testing::tiny_gpt2_config());
    m->to(DType::bf16);
    return m;
  };
  // The reference: this rank's bf16 gradients in f32, averaged over the ranks in f32.
  std::vector<Tensor> reference;
  {
    auto plain = build();
    plain->loss(ids, tgt).backward();
    for (const Tensor& p : plain->parameters()) {
      Tensor g = p.grad().to(DType::f32).clone_raw();
      ctx.group->all_reduce(g, ReduceOp::Avg)->wait();
      reference.push_back(g);
    }
  }
  constexpr double kCapMb = 8.0 / 1024;  // several buckets
  for (const bool compiled : {false, true}) {
    SCOPED_TRACE(compiled ? "compiled" : "eager");
    auto model = build();
    std::unique_ptr<FullyShardedDataParallel> fsdp;
    std::unique_ptr<DistributedDataParallel> ddp;
    if (stage == 3) {
      FsdpOptions o;
      o.reduce_dtype = DType::f32;
      fsdp = std::make_unique<FullyShardedDataParallel>(*model, ctx.group, o);
    } else {
      DdpOptions o;
      o.bucket_cap_mb = kCapMb;
      o.zero_stage = stage;
      o.reduce_dtype = DType::f32;
      ddp = std::make_unique<DistributedDataParallel>(model->parameters(), ctx.group, o);
    }
    optim::MasterWeights masters(fsdp ? fsdp->optimizer_params() : ddp->optimizer_params());
    std::vector<Tensor> before;
    for (const Tensor& m : masters.master()) before.push_back(m.clone_raw());
    optim::SGD opt(masters.master(), optim::SGDOptions{.lr = 1.0});
    auto step = [&](const std::vector<Tensor>& b) {
      Tensor l = model->loss(b[0], b[1]);
      l.backward();
      if (fsdp) fsdp->synchronize();
      else ddp->synchronize();
      masters.copy_grads_to_master();
      opt.step();
      opt.zero_grad();
      masters.copy_to_model();
      if (fsdp) {
        fsdp->zero_grad();
      } else {
        ddp->after_step();
        ddp->zero_grad();
      }
      return std::vector<Tensor>{l.detach()};
    };
    run_step_once(step, {ids, tgt}, compiled);
    double worst = 0, rounded = 0;
    if (fsdp) {
      for (size_t i = 0; i < reference.size(); ++i) {
        const Tensor was = fsdp->gather_param(i, before), now = fsdp->gather_param(i, masters.master());
        if (ctx.info.rank == 0) measure_move(was, now, reference[i], worst, rounded);
      }
      if (ctx.info.rank != 0) continue;
    } else {
      const std::vector<Tensor> chunks = bucket_chunks(reference, kCapMb, ctx);
      ASSERT_EQ(chunks.size(), before.size()) << "one master per bucket";
      ASSERT_GT(chunks.size(), 2u) << "the test needs several buckets";
      for (size_t b = 0; b < chunks.size(); ++b) measure_move(before[b], masters.master()[b], chunks[b], worst, rounded);
    }
    std::printf("[ zero     ] stage %d, rank %d, %s: the masters moved by the f32 mean gradient within %.2g (of its "
                "largest element); by its bf16 rounding they would be %.2g away\n",
                stage, ctx.info.rank, compiled ? "compiled" : "eager", worst, rounded);
    EXPECT_LT(worst, 1e-6);
    EXPECT_GT(rounded, 1e-4) << "bf16 rounding must change the update, else this test checks nothing";
  }
}

TEST(ZeroStages, ThreeKeepsAnF32ReducedGradientUnroundedForTheF32Masters) {
  if (is_rank_process())
    return f32_gradients_reach_the_masters(
        init_distributed(ingot::testing::gloo_test_init(std::chrono::milliseconds(60000))), 3);
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2).within(std::chrono::seconds(120))));
}

TEST(ZeroStages, OneAndTwoKeepAnF32ReducedGradientUnroundedForTheF32Masters) {
  if (is_rank_process()) {
    auto ctx = init_distributed(ingot::testing::gloo_test_init(std::chrono::milliseconds(60000)));
    for (const int stage : {1, 2}) {
      SCOPED_TRACE("ZeRO-" + std::to_string(stage));
      f32_gradients_reach_the_masters(ctx, stage);
    }
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2).within(std::chrono::seconds(120))));
}

// Note [Narrow wire, wide sum] (distributed/process_group.h) with FsdpOptions::reduce_wire_dtype bf16: f32 weights,
// gradients reduced in f32 but sent in bf16. SGD with lr 1 on the shards moves each parameter by the f32 mean of every
// rank's gradient rounded to bf16 (the reference: a plain model per rank, its gradients rounded, an f32 all-reduce),
// eagerly and compiled (node by node), on 2 and 4 ranks; the mean of the unrounded gradients, which the same run
// without the option reaches, is far from it (so the option is seen to act).
void narrow_wire_rounds_each_rank_and_sums_in_f32(const DistributedContext& ctx) {
  auto [ids, tgt] = rank_rows(ctx, false);
  auto build = [] {
    manual_seed(5);
    return std::make_unique<models::GPT2>(ingot::testing::tiny_gpt2_config());
  };
  std::vector<Tensor> rounded_mean, exact_mean;
  {
    auto plain = build();
    plain->loss(ids, tgt).backward();
    for (const Tensor& p : plain->parameters()) {
      Tensor r = p.grad().to(DType::bf16).to(DType::f32).clone_raw(), e = p.grad().clone_raw();
      ctx.group->all_reduce(r, ReduceOp::Avg)->wait();
      ctx.group->all_reduce(e, ReduceOp::Avg)->wait();
      rounded_mean.push_back(r);
      exact_mean.push_back(e);
    }
  }
  for (const bool compiled : {false, true}) {
    SCOPED_TRACE(compiled ? "compiled" : "eager");
    auto model = build();
    FsdpOptions o;
    o.reduce_dtype = DType::f32;
    o.reduce_wire_dtype = DType::bf16;
    FullyShardedDataParallel fsdp(*model, ctx.group, o);
    std::vector<Tensor> before;
    for (const Tensor& s : fsdp.optimizer_params()) before.push_back(s.clone_raw());
    optim::SGD opt(fsdp.optimizer_params(), optim::SGDOptions{.lr = 1.0});
    auto step = [&](const std::vector<Tensor>& b) {
      Tensor l = model->loss(b[0], b[1]);
      l.backward();
      fsdp.synchronize();
      opt.step();
      opt.zero_grad();
      return std::vector<Tensor>{l.detach()};
    };
    run_step_once(step, {ids, tgt}, compiled);
    double worst = 0, unrounded = 0;
    for (size_t i = 0; i < rounded_mean.size(); ++i) {
      const Tensor was = fsdp.gather_param(i, before), now = fsdp.gather_param(i, fsdp.optimizer_params());
      if (ctx.info.rank != 0) continue;
      const double scale = std::max(1e-12, amax(abs(rounded_mean[i])).item());
      worst = std::max(worst, amax(abs(sub(now, sub(was, rounded_mean[i])))).item() / scale);
      unrounded = std::max(unrounded, amax(abs(sub(exact_mean[i], rounded_mean[i]))).item() / scale);
    }
    if (ctx.info.rank != 0) continue;
    std::printf("[ zero     ] world %d, %s: moved by the f32 mean of the bf16-rounded gradients within %.2g; the "
                "unrounded mean is %.2g away\n", ctx.info.world_size, compiled ? "compiled" : "eager", worst,
                unrounded);
    EXPECT_LT(worst, 1e-6);
    EXPECT_GT(unrounded, 1e-4) << "rounding each rank's gradient must change the mean, else this test checks nothing";
  }
}

TEST(ZeroStages, ThreeSendsBf16GradientsAndSumsThemInF32WithANarrowWire) {
  if (is_rank_process())
    return narrow_wire_rounds_each_rank_and_sums_in_f32(
        init_distributed(ingot::testing::gloo_test_init(std::chrono::milliseconds(60000))));
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2).within(std::chrono::seconds(120))));
  expect_ranks_pass(spawn_ranks(ingot::testing::world(4).within(std::chrono::seconds(120))));
}

TEST(ZeroStages, ANarrowWireWiderThanTheReductionIsRefusedByName) {
  auto options = [] {
    FsdpOptions o;
    o.reduce_dtype = DType::bf16;
    o.reduce_wire_dtype = DType::f32;
    return o;
  };
  if (is_rank_process()) {
    auto ctx = init_distributed(ingot::testing::gloo_test_init());
    manual_seed(5);
    models::GPT2 m(ingot::testing::tiny_gpt2_config());
    const std::string err = ingot::testing::error_of([&] { FullyShardedDataParallel f(m, ctx.group, options()); });
    EXPECT_NE(err.find("reduce_wire_dtype must be a floating dtype no wider than reduce_dtype"), std::string::npos)
        << err;
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2)));
}

// Note [Parameters without bytes] (fsdp.h): a Llama built under nn::SkipInit without bytes and sharded makes one
// unit whole at a time, so the set-up (build, wrap, load every rank's slices) never allocates more than the
// shards plus the largest unit (+ 5%): below 45% of the whole model's bytes on 4 ranks, 70% on 2 (a block, the
// largest unit of this 8-block model, is ~1/9 of it). Its training then equals that of the same weights built whole and broadcast.
void rank_body_never_whole() {
  auto ctx = init_distributed(ingot::testing::gloo_test_init());
  const int world = ctx.info.world_size;
  models::LlamaConfig cfg = ingot::testing::tiny_llama_config();
  cfg.num_hidden_layers = 8;
  manual_seed(5);
  models::Llama whole(cfg);
  std::vector<Tensor> values;  // what a checkpoint would hold
  int64_t model_bytes = 0;
  for (const Tensor& p : whole.parameters()) {
    values.push_back(p.clone_raw());
    model_bytes += static_cast<int64_t>(p.nbytes());
  }
  FsdpOptions no_broadcast;
  no_broadcast.broadcast_parameters = false;
  const int64_t base = allocated();
  cpu_allocator().reset_peak();
  std::unique_ptr<models::Llama> built;
  {
    nn::SkipInit skip(DType::f32, Device::cpu());
    built = std::make_unique<models::Llama>(cfg);
  }
  FullyShardedDataParallel fsdp(*built, ctx.group, no_broadcast);
  fsdp.load_shards([&](size_t i, int64_t begin, int64_t end, Tensor& dst) {
    dst.copy_(narrow(reshape(values[i], {values[i].numel()}), 0, begin, end - begin));
  });
  const int64_t setup_peak = cpu_allocator().stats().peak_allocated_bytes - base;
  int64_t shards = 0, largest = 0;
  for (const BucketPlan& p : fsdp.layout()) {
    shards += unit_bytes(p) / world;
    largest = std::max(largest, unit_bytes(p));
  }
  const double fraction = world >= 4 ? 0.45 : 0.7;
  if (ctx.info.rank == 0)
    std::printf("[ zero     ] world %d: set-up peak %lld B for a model of %lld B (shards %lld B, largest unit %lld B)\n",
                world, static_cast<long long>(setup_peak), static_cast<long long>(model_bytes),
                static_cast<long long>(shards), static_cast<long long>(largest));
  EXPECT_LE(static_cast<double>(setup_peak), 1.05 * static_cast<double>(shards + largest));
  EXPECT_LT(static_cast<double>(setup_peak), fraction * static_cast<double>(model_bytes));
  const std::vector<double> got = three_steps(ctx, *built, &fsdp);
  FullyShardedDataParallel broadcast(whole, ctx.group);
  const std::vector<double> want = three_steps(ctx, whole, &broadcast);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i;
}

TEST(ZeroStages, ThreeShardsAModelBuiltWithoutBytesOneUnitAtATime) {
  if (is_rank_process()) return rank_body_never_whole();
  expect_ranks_pass(spawn_ranks(ingot::testing::world(2)));
}

TEST(ZeroStages, ThreeShardsAModelBuiltWithoutBytesOneUnitAtATimeOnFourRanks) {
  if (is_rank_process()) return rank_body_never_whole();
  expect_ranks_pass(spawn_ranks(ingot::testing::world(4).within(std::chrono::seconds(60))));
}
}  // namespace
}  // namespace ingot::distributed
