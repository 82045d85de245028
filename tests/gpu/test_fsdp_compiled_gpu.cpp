// Compiled ZeRO-3 on GPUs over NCCL (distributed/fsdp_compiled.h, compile/passes/unit_gathers.h): the step traced
// into one graph with the units' all-gathers and reduce-scatters as nodes trains like eager ZeRO-3 on 2 GPUs
// (and 4 where visible): reshard_after_forward on and off, gradients reduced in f32 and bf16, bf16 compute with
// f32 master shards, the last blocks kept with activations recomputed; reduce-overhead (CUDA graphs) too. The CPU twin runs on Gloo
// (tests/distributed/test_fsdp_compiled.cpp). Without 2 GPUs and NCCL every test skips with the reason.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "autograd/ops.h"
#include "compile/api.h"
#include "distributed/bootstrap.h"
#include "distributed/fsdp.h"
#include "distributed/process_group.h"
#include "distributed/sampler.h"
#include "distributed/spawn.h"
#include "models/tiny_models.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "runtime/allocator.h"
#include "runtime/file_util.h"
#include "runtime/rng.h"
#include "tests/gpu/multi_gpu.h"

namespace ingot::distributed {
namespace {

using namespace std::chrono_literals;
using ingot::testing::expect_ranks_pass;
using ingot::testing::is_rank_process;
using ingot::testing::spawn_ranks;

struct Setup {
  bool compiled = true;
  bool reshard = true;
  std::optional<DType> reduce_dtype;
  bool bf16_masters = false;  // bf16 weights (and shards), f32 master shards updated by AdamW
  CompileMode mode = CompileMode::Default;
  // With bf16_masters: the shards lose their bytes and every gather casts from the masters, on NCCL's comm stream
  // (FullyShardedDataParallel::gather_from_masters, Note [Gathers cast on the comm stream]).
  bool gather_from_masters = false;
  bool llama = false;         // tiny Llama (an untied table: Note [Vocabulary-parallel embeddings]) instead of GPT-2
  bool gather_table = false;  // FsdpOptions::vocab_parallel_embeddings false
  std::optional<DType> wire;  // FsdpOptions::reduce_wire_dtype (Note [Narrow wire, wide sum])
  int keep_last_blocks = 0;   // FsdpOptions::keep_last_blocks (Note [The last blocks kept])
  double memory_budget = 1.0; // CompileOptions::memory_budget (compile/passes/remat.h)
};

struct Trained {
  std::vector<double> losses;  // the global batch's mean loss per step
  std::vector<Tensor> params;  // whole values after training, f32 on the CPU
  CompileStats stats;
  int64_t peak = 0;            // device bytes at the peak of the last step beyond those before the model existed
};

// Tiny GPT-2 (3 blocks) on this rank's GPU, AdamW, 5 steps on this rank's rows of a fixed global batch of 8.
Trained train(Device dev, const DistributedContext& ctx, const Setup& s, const std::string& cache) {
  auto [ids, tgt] = ingot::testing::repeating_batch(8, 8);
  const RowRange r = batch_shard(8, ctx.info.rank, ctx.info.world_size);
  Tensor x = contiguous(narrow(ids, 0, r.begin, r.end - r.begin)).to(dev);
  Tensor y = contiguous(narrow(tgt, 0, r.begin, r.end - r.begin)).to(dev);
  Trained out;
  Allocator& alloc = allocator_for(dev);
  const int64_t base = alloc.stats().allocated_bytes;
  {
    manual_seed(11);
    models::GPT2Config cfg = ingot::testing::tiny_gpt2_config();
    cfg.n_layer = 3;
    models::LlamaConfig lc = ingot::testing::tiny_llama_config();
    lc.num_hidden_layers = 3;
    std::unique_ptr<models::CausalLM> made =
        s.llama ? std::unique_ptr<models::CausalLM>(std::make_unique<models::Llama>(lc))
                : std::unique_ptr<models::CausalLM>(std::make_unique<models::GPT2>(cfg));
    models::CausalLM& model = *made;
    model.to(dev);
    if (s.bf16_masters) model.to(DType::bf16);
    FsdpOptions o;
    o.reshard_after_forward = s.reshard;
    o.reduce_dtype = s.reduce_dtype;
    o.vocab_parallel_embeddings = !s.gather_table;
    o.reduce_wire_dtype = s.wire;
    o.keep_last_blocks = s.keep_last_blocks;
    FullyShardedDataParallel fsdp(model, ctx.group, o);
    std::unique_ptr<optim::MasterWeights> masters;
    std::vector<Tensor> params = fsdp.optimizer_params();
    if (s.bf16_masters) {
      masters = std::make_unique<optim::MasterWeights>(params);
      params = masters->master();
      if (s.gather_from_masters) fsdp.gather_from_masters(params);
    }
    optim::AdamW opt(params, optim::AdamWOptions{3e-3, 0.9, 0.95, 1e-8, 0.1});
    auto step = [&](const std::vector<Tensor>& b) {
      Tensor loss = model.loss(b[0], b[1]);
      loss.backward();
      fsdp.synchronize();
      if (masters) masters->copy_grads_to_master();
      opt.step();
      opt.zero_grad();
      if (masters) {
        masters->copy_to_model();
        model.zero_grad();
      }
      fsdp.zero_grad();
      return std::vector<Tensor>{loss};
    };
    CompileOptions co;
    co.cache_dir = cache;
    co.mode = s.mode;
    co.memory_budget = s.memory_budget;
    CompiledFunction fn = compile(step, co);
    for (int i = 0; i < 5; ++i) {
      if (i == 4) alloc.reset_peak();
      Tensor l = (s.compiled ? fn({x, y}) : step({x, y}))[0];
      Tensor t = reshape(cast(l, DType::f32), {1}).contiguous_raw();
      ctx.group->all_reduce(t, ReduceOp::Avg)->wait();
      out.losses.push_back(t.item());
      if (i == 4) out.peak = alloc.stats().peak_allocated_bytes - base;
    }
    out.stats = fn.stats();
    fsdp.unshard();
    for (const Tensor& p : model.parameters()) out.params.push_back(p.to(DType::f32).to(Device::cpu()));
  }
  return out;
}

void expect_same_training(const Trained& got, const Trained& want, double tol, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], tol * std::abs(want.losses[i])) << what << ": step " << i;
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (size_t k = 0; k < want.params.size(); ++k)
    EXPECT_LE(max_rel_error(got.params[k], want.params[k], 10 * tol, tol), 1.0) << what << ": parameter " << k;
}

size_t count(const std::string& g, const std::string& what) {
  size_t n = 0;
  for (size_t p = g.find(what); p != std::string::npos; p = g.find(what, p + 1)) ++n;
  return n;
}

// Tolerances: f32 with TF32 off, generated kernels summing in another order than eager's: 1e-4 relative on losses
// and weights (the DDP GPU tests' bound); bf16 weights with f32 masters: 2e-2 (bf16 rounding of the activations
// in fused kernels vs per eager op).
void rank_body() {
  auto ctx = init_distributed(nccl_init(std::chrono::seconds(120)));
  const Device dev(DeviceType::cuda, ctx.info.local_rank);
  const std::string cache = std::getenv("INGOT_TEST_CACHE_DIR");
  for (bool reshard : {true, false})
    for (std::optional<DType> rd : {std::optional<DType>(), std::optional<DType>(DType::bf16)}) {
      const std::string what = std::string("compiled vs eager ZeRO-3, reshard ") + (reshard ? "on" : "off") +
                               ", reduce " + (rd ? "bf16" : "f32");
      Setup e{.compiled = false, .reshard = reshard, .reduce_dtype = rd, .bf16_masters = false,
              .mode = CompileMode::Default};
      Setup c = e;
      c.compiled = true;
      const Trained eager = train(dev, ctx, e, cache), comp = train(dev, ctx, c, cache);
      expect_same_training(comp, eager, 1e-4, what);
      EXPECT_EQ(comp.stats.compiles, 1) << what;
      // Units: embeddings, 3 blocks, head (Note [Embeddings and head are units]); the tied embeddings are
      // gathered again for the head, each block again for its backward when resharding.
      EXPECT_EQ(count(comp.stats.last_graph, "= reduce_scatter_start("), 5u) << what;
      EXPECT_EQ(count(comp.stats.last_graph, "= all_gather_start("), reshard ? 9u : 6u) << what;
      if (ctx.info.rank == 0)
        std::printf("[ fsdp compiled nccl ] %s: peak of a step eager %lld B, compiled %lld B\n", what.c_str(),
                    static_cast<long long>(eager.peak), static_cast<long long>(comp.peak));
    }
  Setup e{.compiled = false, .reshard = true, .reduce_dtype = std::nullopt, .bf16_masters = true,
          .mode = CompileMode::Default};
  Setup c = e;
  c.compiled = true;
  expect_same_training(train(dev, ctx, c, cache), train(dev, ctx, e, cache), 2e-2,
                       "bf16 weights with f32 master shards: compiled vs eager ZeRO-3");
  // Gathered from the masters (cast on the comm stream), eager and compiled, against the bf16 shards' run: the
  // same weights (the shards were always the masters rounded), so the same training to bf16 rounding.
  Setup em = e, cm = c;
  em.gather_from_masters = cm.gather_from_masters = true;
  const Trained from_masters = train(dev, ctx, em, cache);
  expect_same_training(from_masters, train(dev, ctx, e, cache), 2e-2,
                       "eager ZeRO-3 gathered from f32 masters vs from bf16 shards");
  expect_same_training(train(dev, ctx, cm, cache), from_masters, 2e-2,
                       "gathered from f32 masters: compiled vs eager ZeRO-3");
}

void rank_body_reduce_overhead() {
  auto ctx = init_distributed(nccl_init(std::chrono::seconds(120)));
  const Device dev(DeviceType::cuda, ctx.info.local_rank);
  const std::string cache = std::getenv("INGOT_TEST_CACHE_DIR");
  Setup e{.compiled = false, .reshard = true, .reduce_dtype = std::nullopt, .bf16_masters = false,
          .mode = CompileMode::Default};
  Setup c = e;
  c.compiled = true;
  c.mode = CompileMode::ReduceOverhead;
  const Trained comp = train(dev, ctx, c, cache);
  expect_same_training(comp, train(dev, ctx, e, cache), 1e-4, "reduce-overhead compiled vs eager ZeRO-3");
  // The gathers' casts from f32 masters on the comm stream, captured in the CUDA graphs and replayed.
  Setup em = e, cm = c;
  em.bf16_masters = cm.bf16_masters = em.gather_from_masters = cm.gather_from_masters = true;
  expect_same_training(train(dev, ctx, cm, cache), train(dev, ctx, em, cache), 2e-2,
                       "reduce-overhead compiled vs eager ZeRO-3, gathered from f32 masters");
  if (ctx.info.rank == 0)
    std::printf("[ fsdp compiled nccl ] reduce-overhead: %lld CUDA graphs, fallback: '%s'\n",
                static_cast<long long>(comp.stats.cuda_graphs), comp.stats.cuda_graph_fallback.c_str());
}

// Note [Vocabulary-parallel embeddings] (fsdp.h) over NCCL: a tiny Llama (64-row untied table) whose table is looked
// up where its rows lie trains like the gathered table, eager and compiled, in f32 (1e-4) and in bf16 from f32
// masters (2e-2: the lookup converts the master's rows itself, the sum reduce-scatter runs in bf16), and captured
// in CUDA graphs (reduce-overhead).
void rank_body_vocab_parallel() {
  auto ctx = init_distributed(nccl_init(std::chrono::seconds(120)));
  const Device dev(DeviceType::cuda, ctx.info.local_rank);
  const std::string cache = std::getenv("INGOT_TEST_CACHE_DIR");
  Setup gathered{.compiled = false, .reshard = true, .reduce_dtype = std::nullopt, .bf16_masters = false,
                 .mode = CompileMode::Default, .gather_from_masters = false, .llama = true, .gather_table = true};
  Setup eager = gathered;
  eager.gather_table = false;
  Setup comp = eager;
  comp.compiled = true;
  const Trained g = train(dev, ctx, gathered, cache), e = train(dev, ctx, eager, cache);
  const Trained c = train(dev, ctx, comp, cache);
  expect_same_training(e, g, 1e-4, "eager ZeRO-3: vocabulary-parallel vs gathered table");
  expect_same_training(c, e, 1e-4, "vocabulary-parallel: compiled vs eager ZeRO-3");
  EXPECT_EQ(count(c.stats.last_graph, "unit=embeddings"), 0u) << c.stats.last_graph;
  EXPECT_EQ(count(c.stats.last_graph, "op=sum"), 1u) << c.stats.last_graph;
  for (Setup* st : {&gathered, &eager, &comp}) st->bf16_masters = st->gather_from_masters = true;
  const Trained g16 = train(dev, ctx, gathered, cache);
  expect_same_training(train(dev, ctx, eager, cache), g16, 2e-2,
                       "bf16 from f32 masters, eager: vocabulary-parallel vs gathered table");
  expect_same_training(train(dev, ctx, comp, cache), g16, 2e-2,
                       "bf16 from f32 masters: compiled vocabulary-parallel vs eager gathered table");
  comp.mode = CompileMode::ReduceOverhead;
  const Trained ro = train(dev, ctx, comp, cache);
  expect_same_training(ro, g16, 2e-2, "reduce-overhead vocabulary-parallel vs eager gathered table");
  EXPECT_GT(ro.stats.cuda_graphs, 0) << ro.stats.cuda_graph_fallback;
}

// Note [Narrow wire, wide sum] (distributed/process_group.h) over NCCL (an all-to-all of bf16 chunks, summed in f32:
// eagerly on a stream of its own, compiled by each unit's AdamW update): compiled follows eager with the same wire, in f32 weights (1e-4) and bf16 weights from f32
// masters (2e-2), and captured in CUDA graphs (reduce-overhead); the graph says where the pieces are summed.
void rank_body_narrow_wire() {
  auto ctx = init_distributed(nccl_init(std::chrono::seconds(120)));
  const Device dev(DeviceType::cuda, ctx.info.local_rank);
  const std::string cache = std::getenv("INGOT_TEST_CACHE_DIR");
  Setup eager{.compiled = false, .reshard = true, .reduce_dtype = std::nullopt, .bf16_masters = false,
              .mode = CompileMode::Default};
  eager.wire = DType::bf16;
  Setup comp = eager;
  comp.compiled = true;
  const Trained c = train(dev, ctx, comp, cache);
  expect_same_training(c, train(dev, ctx, eager, cache), 1e-4, "bf16 wire, f32 weights: compiled vs eager ZeRO-3");
  // Note [Pieces read by the update]: each unit's exchange, its pieces summed by its AdamW update.
  EXPECT_EQ(count(c.stats.last_graph, "the others' pieces"), 5u) << c.stats.last_graph;
  EXPECT_GE(count(c.stats.last_graph, "gradient pieces="), 1u) << c.stats.last_graph;
  EXPECT_EQ(count(c.stats.last_graph, "sum_pieces("), 0u) << c.stats.last_graph;
  eager.bf16_masters = comp.bf16_masters = eager.gather_from_masters = comp.gather_from_masters = true;
  eager.reduce_dtype = comp.reduce_dtype = DType::f32;
  const Trained e16 = train(dev, ctx, eager, cache);
  expect_same_training(train(dev, ctx, comp, cache), e16, 2e-2,
                       "bf16 wire, bf16 weights from f32 masters: compiled vs eager ZeRO-3");
  comp.mode = CompileMode::ReduceOverhead;
  const Trained ro = train(dev, ctx, comp, cache);
  expect_same_training(ro, e16, 2e-2, "bf16 wire: reduce-overhead vs eager ZeRO-3");
  EXPECT_GT(ro.stats.cuda_graphs, 0) << ro.stats.cuda_graph_fallback;
}

// The 8B benchmark's settings on the tiny Llama (SwiGLU, RMSNorm; bench/RESULTS.md 2026-11-27 twenty-fourth
// session): the narrow wire, the last 2 of 3 blocks kept gathered from forward to backward, and memory_budget 0.5
// (each block's SwiGLU product and normalized inputs recomputed in the backward). Compiled follows eager ZeRO-3 with
// the same wire and kept blocks, in f32 weights (1e-4) and bf16 weights from f32 masters (2e-2), and the compiler is
// seen to recompute.
void rank_body_recomputed_and_kept() {
  auto ctx = init_distributed(nccl_init(std::chrono::seconds(120)));
  const Device dev(DeviceType::cuda, ctx.info.local_rank);
  const std::string cache = std::getenv("INGOT_TEST_CACHE_DIR");
  Setup eager{.compiled = false, .reshard = true, .reduce_dtype = std::nullopt, .bf16_masters = false,
              .mode = CompileMode::Default};
  eager.llama = true;
  eager.wire = DType::bf16;
  eager.keep_last_blocks = 2;
  Setup comp = eager;
  comp.compiled = true;
  comp.memory_budget = 0.5;
  const Trained c = train(dev, ctx, comp, cache);
  EXPECT_GT(c.stats.recomputed_bytes, 0) << "memory_budget 0.5 must recompute something, else this checks nothing";
  expect_same_training(c, train(dev, ctx, eager, cache), 1e-4,
                       "bf16 wire, 2 blocks kept, memory_budget 0.5, f32 weights: compiled vs eager ZeRO-3");
  eager.bf16_masters = comp.bf16_masters = eager.gather_from_masters = comp.gather_from_masters = true;
  eager.reduce_dtype = comp.reduce_dtype = DType::f32;
  expect_same_training(train(dev, ctx, comp, cache), train(dev, ctx, eager, cache), 2e-2,
                       "bf16 wire, 2 blocks kept, memory_budget 0.5, bf16 from f32 masters: compiled vs eager ZeRO-3");
}

void spawn(int world) {
  TempDir cache("ingot-fsdp-compiled-gpu-");
  ingot::testing::SpawnOptions o = ingot::testing::world(world).within(600s);
  o.env["INGOT_TEST_CACHE_DIR"] = cache.path();
  expect_ranks_pass(spawn_ranks(o));
}

TEST(CompiledFsdpOnGpus, FollowsEagerZeroThreeOnTwoGpus) {
  if (is_rank_process()) return rank_body();
  INGOT_REQUIRE_GPUS(2);
  spawn(2);
}

TEST(CompiledFsdpOnGpus, FollowsEagerZeroThreeOnFourGpus) {
  if (is_rank_process()) return rank_body();
  INGOT_REQUIRE_GPUS(4);
  spawn(4);
}

TEST(CompiledFsdpOnGpus, VocabParallelEmbeddingsFollowTheGatheredTableOnTwoGpus) {
  if (is_rank_process()) return rank_body_vocab_parallel();
  INGOT_REQUIRE_GPUS(2);
  spawn(2);
}

TEST(CompiledFsdpOnGpus, VocabParallelEmbeddingsFollowTheGatheredTableOnFourGpus) {
  if (is_rank_process()) return rank_body_vocab_parallel();
  INGOT_REQUIRE_GPUS(4);
  spawn(4);
}

TEST(CompiledFsdpOnGpus, ANarrowWireFollowsEagerZeroThreeOnTwoGpus) {
  if (is_rank_process()) return rank_body_narrow_wire();
  INGOT_REQUIRE_GPUS(2);
  spawn(2);
}

TEST(CompiledFsdpOnGpus, ANarrowWireFollowsEagerZeroThreeOnFourGpus) {
  if (is_rank_process()) return rank_body_narrow_wire();
  INGOT_REQUIRE_GPUS(4);
  spawn(4);
}

TEST(CompiledFsdpOnGpus, RecomputedActivationsAndKeptBlocksFollowEagerOnTwoGpus) {
  if (is_rank_process()) return rank_body_recomputed_and_kept();
  INGOT_REQUIRE_GPUS(2);
  spawn(2);
}

TEST(CompiledFsdpOnGpus, RecomputedActivationsAndKeptBlocksFollowEagerOnFourGpus) {
  if (is_rank_process()) return rank_body_recomputed_and_kept();
  INGOT_REQUIRE_GPUS(4);
  spawn(4);
}

TEST(CompiledFsdpOnGpus, ReduceOverheadFollowsEagerZeroThreeOnTwoGpus) {
  if (is_rank_process()) return rank_body_reduce_overhead();
  INGOT_REQUIRE_GPUS(2);
  spawn(2);
}

}  // namespace
}  // namespace ingot::distributed
