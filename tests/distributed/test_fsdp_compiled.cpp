// Compiled ZeRO-3 (distributed/fsdp_compiled.h, compile/passes/unit_gathers.h): FullyShardedDataParallel traced
// into the step's one graph over Gloo with 2 and 4 real processes. The same training as eager ZeRO-3, DDP and one
// process on the whole batch; one gather per unit for the forward (+ one per block for the backward when
// resharding) and one reduce-scatter per unit in the graph; ~1/N of DDP's bytes held and a lower peak; unit k+1's
// gather issued while unit k computes and not earlier.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "autograd/ops.h"
#include "compile/api.h"
#include "distributed/compiled_ranks.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "distributed/sampler.h"
#include "models/tiny_models.h"
#include "optim/optimizer.h"
#include "runtime/allocator.h"
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

// Longer timeouts than the eager tests: each rank compiles the step (g++) before its first collective.
constexpr auto kRankTimeout = 60s;

enum class Mode { OneProcess, Ddp, DdpCompiled, Eager3, Compiled3 };

struct Setup {
  Mode mode = Mode::Compiled3;
  bool reshard = true;
  std::optional<DType> reduce_dtype;
  int micro = 1;  // micro-batches per step (gradient accumulation)
  int steps = 4;
  CompileBackend backend = CompileBackend::Auto;
  bool eager_first = false;  // the first step eagerly (the optimizer state exists before the compiled call traces)
  bool one_backward = false;  // the micro-batches' losses summed and differentiated once (two forwards, one backward)
  int lag = 1;  // CompileOptions::unit_reduction_lag
  int keep_last = 0;  // FsdpOptions::keep_last_blocks
  bool llama = false;  // tiny Llama (untied embeddings) instead of GPT-2
  bool gather_table = false;  // FsdpOptions::vocab_parallel_embeddings false

  // Chainable: run(Mode::Compiled3).keep_after_forward().reduce_in(DType::bf16).
  Setup& keep_after_forward() { reshard = false; return *this; }
  Setup& keep_last_blocks(int n) { keep_last = n; return *this; }
  Setup& reduce_in(DType d) { reduce_dtype = d; return *this; }
  Setup& micro_batches(int n) { micro = n; return *this; }
  Setup& for_steps(int n) { steps = n; return *this; }
  Setup& node_by_node() { backend = CompileBackend::Eager; return *this; }
  Setup& first_step_eager() { eager_first = true; return *this; }
  Setup& summed_before_backward() { one_backward = true; return *this; }
  Setup& reductions_waited_after(int units) { lag = units; return *this; }
  Setup& on_llama() { llama = true; return *this; }
  Setup& gathering_the_table() { gather_table = true; return *this; }
};
Setup run(Mode m) {
  Setup s;
  s.mode = m;
  return s;
}

struct Trained {
  std::vector<double> losses;  // the global batch's mean loss per step
  std::vector<Tensor> params;  // whole values after training
  CompileStats stats;
  size_t units = 0;
  int64_t held = 0;   // bytes allocated after the last step beyond those before the model existed
  int64_t peak = 0;   // peak bytes allocated during the last step beyond those before the model existed
  int64_t first_peak = 0;  // the same for the first compiled call (it traces: runs the step eagerly)
};

int64_t allocated() { return cpu_allocator().stats().allocated_bytes; }

models::GPT2Config config() {
  models::GPT2Config c = ingot::testing::tiny_gpt2_config();
  c.n_layer = 3;  // root + 3 blocks: unit k-1, k and k+1 exist for the prefetch order
  return c;
}

// Tiny GPT-2 (3 blocks), AdamW, `steps` steps on this rank's rows of a fixed global batch of 4 sequences (one
// process: all 4), as `micro` micro-batches per step.
Trained train(const DistributedContext& ctx, const Setup& s, const std::string& cache_dir) {
  const bool one = s.mode == Mode::OneProcess;
  const int rank = one ? 0 : ctx.info.rank, world = one ? 1 : ctx.info.world_size;
  auto [ids, tgt] = ingot::testing::repeating_batch(4 * s.micro, 8);
  std::vector<Tensor> batch;
  std::vector<double> weights;
  for (int m = 0; m < s.micro; ++m) {
    const RowRange r = batch_shard(4, rank, world);
    batch.push_back(contiguous(narrow(ids, 0, 4 * m + r.begin, r.end - r.begin)));
    batch.push_back(contiguous(narrow(tgt, 0, 4 * m + r.begin, r.end - r.begin)));
    weights.push_back(1.0 / s.micro);
  }
  Trained out;
  const int64_t base = allocated();
  manual_seed(5);
  {
    models::LlamaConfig lc = ingot::testing::tiny_llama_config();
    lc.num_hidden_layers = 3;
    std::unique_ptr<models::CausalLM> made =
        s.llama ? std::unique_ptr<models::CausalLM>(std::make_unique<models::Llama>(lc))
                : std::unique_ptr<models::CausalLM>(std::make_unique<models::GPT2>(config()));
    models::CausalLM& model = *made;
    std::unique_ptr<DistributedDataParallel> ddp;
    std::unique_ptr<FullyShardedDataParallel> fsdp;
    if (s.mode == Mode::Ddp || s.mode == Mode::DdpCompiled) {
      DdpOptions o;
      o.bucket_cap_mb = 8.0 / 1024;
      o.reduce_dtype = s.reduce_dtype;
      ddp = std::make_unique<DistributedDataParallel>(model, ctx.group, o);
    } else if (!one) {
      FsdpOptions o;
      o.reshard_after_forward = s.reshard;
      o.keep_last_blocks = s.keep_last;
      o.reduce_dtype = s.reduce_dtype;
      o.vocab_parallel_embeddings = !s.gather_table;
      fsdp = std::make_unique<FullyShardedDataParallel>(model, ctx.group, o);
      out.units = fsdp->layout().size();
    }
    optim::AdamW opt(ddp ? ddp->optimizer_params() : fsdp ? fsdp->optimizer_params() : model.parameters(),
                     optim::AdamWOptions{3e-3, 0.9, 0.95, 1e-8, 0.1});
    auto step = [&](const std::vector<Tensor>& b) {
      Tensor total;
      if (s.one_backward) {
        for (int m = 0; m < s.micro; ++m) {
          Tensor l = model.loss(b[2 * m], b[2 * m + 1]) * weights[static_cast<size_t>(m)];
          total = total.defined() ? total + l : l;
        }
        total.backward();
        if (fsdp) fsdp->synchronize();
        total = total.detach();
      }
      for (int m = 0; m < (s.one_backward ? 0 : s.micro); ++m) {
        Tensor l = model.loss(b[2 * m], b[2 * m + 1]) * weights[static_cast<size_t>(m)];
        if (ddp && m + 1 < s.micro) {
          auto guard = ddp->no_sync();
          l.backward();
        } else {
          l.backward();
        }
        if (fsdp) fsdp->synchronize();  // every FSDP backward reduces into the shards' .grad
        total = total.defined() ? total + l.detach() : l.detach();
      }
      if (ddp) ddp->step(opt);
      else opt.step();
      if (ddp) ddp->zero_grad();
      else if (fsdp) fsdp->zero_grad();
      else model.zero_grad();
      opt.zero_grad();
      return std::vector<Tensor>{total};
    };
    CompileOptions co;
    co.cache_dir = cache_dir;
    co.backend = s.backend;
    co.unit_reduction_lag = s.lag;
    CompiledFunction fn = compile(step, co);
    const bool compiled = s.mode == Mode::DdpCompiled || s.mode == Mode::Compiled3;
    for (int i = 0; i < s.steps; ++i) {
      const bool tracing = compiled && i == (s.eager_first ? 1 : 0);
      if (tracing || i + 1 == s.steps) cpu_allocator().reset_peak();
      const Tensor l = (compiled && (i > 0 || !s.eager_first) ? fn(batch) : step(batch))[0];
      if (tracing) out.first_peak = cpu_allocator().stats().peak_allocated_bytes - base;
      if (i + 1 == s.steps) {
        out.peak = cpu_allocator().stats().peak_allocated_bytes - base;
        out.held = allocated() - base;
      }
      double v = l.item();
      if (!one) {  // every rank's mean is over an equal share: their mean is the global batch's
        Tensor t = from_vector(std::vector<double>{v}, {1}, DType::f64);
        ctx.group->all_reduce(t, ReduceOp::Avg)->wait();
        v = t.item();
      }
      out.losses.push_back(v);
    }
    out.stats = fn.stats();
    if (fsdp) fsdp->unshard();
    for (const Tensor& p : model.parameters()) out.params.push_back(p.clone_raw());
  }
  return out;
}

void expect_same_training(const Trained& got, const Trained& want, double tol, const std::string& what,
                          bool weights = true) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], tol * std::abs(want.losses[i])) << what << ": step " << i;
  if (!weights) return;
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (size_t k = 0; k < want.params.size(); ++k)
    EXPECT_LE(max_rel_error(got.params[k], want.params[k], 10 * tol, tol), 1.0) << what << ": parameter " << k;
}


// The printed graph's nodes: outputs, op, inputs and attributes per line, in schedule order.
struct Line {
  std::vector<int> outs, ins;
  std::string op, attrs;
};

std::vector<Line> parse(const std::string& graph) {
  std::vector<Line> out;
  std::istringstream is(graph);
  std::string text;
  auto ids = [](const std::string& s) {
    std::vector<int> v;
    for (size_t p = s.find('%'); p != std::string::npos; p = s.find('%', p + 1)) v.push_back(std::stoi(s.substr(p + 1)));
    return v;
  };
  while (std::getline(is, text)) {
    const size_t eq = text.find(" = "), open = text.find('(', eq == std::string::npos ? 0 : eq);
    if (text.rfind("  %", 0) != 0 || eq == std::string::npos || open == std::string::npos) continue;
    const size_t close = text.find(')', open);
    Line l;
    const std::string lhs = text.substr(0, eq);
    l.outs = ids(lhs.substr(0, lhs.find(':')));
    l.op = text.substr(eq + 3, open - eq - 3);
    if (l.op.find_first_of(" \"") != std::string::npos) continue;  // a graph input's line
    l.ins = ids(text.substr(open, close - open));
    const size_t a = text.find(" {", close), b = text.find('}', a == std::string::npos ? close : a);
    if (a != std::string::npos && b != std::string::npos) l.attrs = text.substr(a + 2, b - a - 2);
    out.push_back(std::move(l));
  }
  return out;
}

// A unit gather in the scheduled graph: its start line, and the first and last line that reads its gathered
// weights (through the narrow/reshape views the trace made of them).
struct Window {
  std::string unit;
  bool regather = false;
  int start = -1, first = -1, last = -1;
};

std::vector<Window> windows(const std::vector<Line>& lines) {
  std::vector<Window> out;
  for (size_t s = 0; s < lines.size(); ++s) {
    if (lines[s].op != "all_gather_start" || lines[s].attrs.find("unit=") == std::string::npos) continue;
    Window w;
    w.start = static_cast<int>(s);
    const std::string& a = lines[s].attrs;
    const size_t u = a.find("unit=") + 5;
    w.unit = a.substr(u, a.find(',', u) == std::string::npos ? std::string::npos : a.find(',', u) - u);
    std::map<int, bool> closure{{lines[s].outs[0], true}};
    for (size_t i = s + 1; i < lines.size(); ++i) {
      bool reads = false;
      for (int v : lines[i].ins) reads = reads || closure.count(v);
      if (!reads) continue;
      if (lines[i].op == "collective_wait" || lines[i].op == "narrow" || lines[i].op == "reshape") {
        for (int v : lines[i].outs) closure[v] = true;
        continue;
      }
      if (lines[i].op == "all_gather_start") continue;  // a later gather's ordering token
      if (w.first < 0) w.first = static_cast<int>(i);
      w.last = static_cast<int>(i);
    }
    out.push_back(w);
  }
  return out;
}

// Tolerances: f32 sums of the same numbers in another order (reduce-scatter chunks vs all-reduce, per-rank means
// vs one process's whole batch, generated kernels vs eager ones): 1e-4 relative on losses and weights between the
// data-parallel runs, losses only against one process (AdamW turns the rounding of gradients that are ~0 into
// whole steps of lr). bf16 reduction: the compiled run follows eager ZeRO-3 reduced in bf16 within 1e-4 and the
// f32-reduced run within 1e-2.
void rank_body_trains_like_eager(int world) {
  const auto [ctx, cache] = join_compiled_ranks(kRankTimeout);
  ASSERT_EQ(ctx.info.world_size, world);
  const Trained one = train(ctx, run(Mode::OneProcess), cache);
  const Trained ddp = train(ctx, run(Mode::Ddp), cache);
  const Trained eager = train(ctx, run(Mode::Eager3), cache);
  const Trained comp = train(ctx, run(Mode::Compiled3), cache);
  const Trained keep = train(ctx, run(Mode::Compiled3).keep_after_forward(), cache);
  EXPECT_LT(one.losses.back(), one.losses.front() - 0.3) << "the run must actually train";
  expect_same_training(comp, eager, 1e-4, "compiled ZeRO-3 vs eager ZeRO-3");
  expect_same_training(comp, ddp, 1e-4, "compiled ZeRO-3 vs eager DDP");
  expect_same_training(comp, one, 1e-4, "compiled ZeRO-3 vs one process", false);
  expect_same_training(keep, eager, 1e-4, "compiled ZeRO-3 without resharding vs eager ZeRO-3");
  EXPECT_EQ(comp.stats.compiles, 1);
  EXPECT_TRUE(comp.stats.graph_breaks.empty());
  EXPECT_GT(comp.stats.kernels, 0) << "fused groups run as generated kernels";
  if (ctx.info.rank == 0)
    std::printf("[ fsdp     ] world %d: %lld launches, %lld generated kernels (%lld compiled here); losses %.5f -> "
                "%.5f\n",
                world, static_cast<long long>(comp.stats.launches), static_cast<long long>(comp.stats.kernels),
                static_cast<long long>(comp.stats.kernels_generated), comp.losses.front(), comp.losses.back());
  // Units: the embeddings, 3 blocks and the head. Forward: one gather each, and the tied embeddings once more
  // for the head; backward: one more per block (the head is kept, the lookups' backward reads no weights).
  ASSERT_EQ(comp.units, 5u);
  const std::string& g = comp.stats.last_graph;
  EXPECT_EQ(count_occurrences(g, "= all_gather_start("), comp.units + 1 + 3) << g;
  EXPECT_EQ(count_occurrences(g, "regather}"), 2 * 3u)
      << "the blocks' forward gathers and their backward copies: " << g;
  EXPECT_EQ(count_occurrences(g, "= reduce_scatter_start("), comp.units) << g;
  EXPECT_EQ(count_occurrences(g, "= all_reduce_start("), 0u) << g;
  EXPECT_EQ(count_occurrences(g, "\n  grad none -> "), comp.params.size())
      << "no whole gradient leaves the step: " << g;
  const std::string& k = keep.stats.last_graph;
  EXPECT_EQ(count_occurrences(k, "= all_gather_start("), keep.units + 1) << k;
  EXPECT_EQ(count_occurrences(k, "= reduce_scatter_start("), keep.units) << k;
  if (world != 2) return;
  // Note [The last blocks kept] (fsdp.h): the last block is not resharded, eagerly and compiled: one gather less.
  const Trained eager_last = train(ctx, run(Mode::Eager3).keep_last_blocks(1), cache);
  const Trained last = train(ctx, run(Mode::Compiled3).keep_last_blocks(1), cache);
  expect_same_training(eager_last, eager, 1e-4, "eager ZeRO-3 with the last block kept vs resharded");
  expect_same_training(last, eager_last, 1e-4, "compiled vs eager ZeRO-3, the last block kept");
  const std::string& l = last.stats.last_graph;
  EXPECT_EQ(count_occurrences(l, "= all_gather_start("), last.units + 1 + 2) << l;
  EXPECT_EQ(count_occurrences(l, "regather}"), 2 * 2u) << "the first two blocks resharded: " << l;
}

// Note [Vocabulary-parallel embeddings] (fsdp.h): on a Llama (untied table, 64 rows over 2 or 4 ranks) the
// embeddings are looked up where their rows lie, eagerly and compiled, with gradient accumulation and two forwards
// before one backward: the training of the gathered table, DDP and one process (f32: 1e-4 relative, as above). The
// compiled graph holds no gather or reduce-scatter of the table: one all-gather of the ids, one sum reduce-scatter
// of the looked-up rows and one all-gather of their gradient per forward.
void rank_body_vocab_parallel(int world) {
  const auto [ctx, cache] = join_compiled_ranks(kRankTimeout);
  ASSERT_EQ(ctx.info.world_size, world);
  const Trained one = train(ctx, run(Mode::OneProcess).on_llama(), cache);
  const Trained ddp = train(ctx, run(Mode::Ddp).on_llama(), cache);
  const Trained gathered = train(ctx, run(Mode::Eager3).on_llama().gathering_the_table(), cache);
  const Trained eager = train(ctx, run(Mode::Eager3).on_llama(), cache);
  const Trained comp = train(ctx, run(Mode::Compiled3).on_llama(), cache);
  const Trained comp_gathered = train(ctx, run(Mode::Compiled3).on_llama().gathering_the_table(), cache);
  EXPECT_LT(one.losses.back(), one.losses.front() - 0.3) << "the run must actually train";
  expect_same_training(eager, gathered, 1e-4, "eager ZeRO-3: vocabulary-parallel vs gathered table");
  expect_same_training(eager, ddp, 1e-4, "eager vocabulary-parallel ZeRO-3 vs DDP");
  expect_same_training(comp, eager, 1e-4, "compiled vs eager vocabulary-parallel ZeRO-3");
  expect_same_training(comp, comp_gathered, 1e-4, "compiled ZeRO-3: vocabulary-parallel vs gathered table");
  expect_same_training(comp, one, 1e-4, "compiled vocabulary-parallel ZeRO-3 vs one process", false);
  // Units: the embeddings, 3 blocks and the head; the blocks and the head gathered for forward, the blocks again
  // for backward, plus the ids' and the gradient's all-gathers; the table never gathered or reduce-scattered.
  ASSERT_EQ(comp.units, 5u);
  const std::string& g = comp.stats.last_graph;
  EXPECT_EQ(count_occurrences(g, "= all_gather_start("), 4 + 3 + 2) << g;
  EXPECT_EQ(count_occurrences(g, "unit=embeddings"), 0u) << g;
  EXPECT_EQ(count_occurrences(g, "= reduce_scatter_start("), 4 + 1) << g;
  EXPECT_EQ(count_occurrences(g, "op=sum"), 1u) << g;
  // What each is for, which `ingot explain` says.
  EXPECT_EQ(count_occurrences(g, "{for the token ids of every rank}"), 1u) << g;
  EXPECT_EQ(count_occurrences(g, "for the embedding rows looked up on each rank"), 1u) << g;
  EXPECT_EQ(count_occurrences(g, "{for the embeddings' gradient of every rank}"), 1u) << g;
  EXPECT_EQ(count_occurrences(g, "= embedding_rows("), 1u) << g;
  EXPECT_EQ(count_occurrences(g, "= embedding_rows_grad("), 1u) << g;
  EXPECT_EQ(count_occurrences(g, "vocab_parallel_grad"), 0u) << "the identity that makes the gradient is gone: " << g;
  EXPECT_EQ(count_occurrences(comp_gathered.stats.last_graph, "unit=embeddings"), 2u)
      << comp_gathered.stats.last_graph;
  // Two micro-batches (two backwards) and two forwards summed before one backward: the rows' gradients add up.
  for (const bool summed : {false, true}) {
    SCOPED_TRACE(summed ? "two forwards, one backward" : "two backwards");
    Setup e = run(Mode::Eager3).on_llama().micro_batches(2).for_steps(3);
    Setup c = run(Mode::Compiled3).on_llama().micro_batches(2).for_steps(3);
    if (summed) {
      e.summed_before_backward();
      c.summed_before_backward();
    }
    const Trained e2 = train(ctx, e, cache);
    const Trained c2 = train(ctx, c, cache);
    const Trained g2 = train(ctx, e.gathering_the_table(), cache);
    expect_same_training(e2, g2, 1e-4, "eager: vocabulary-parallel vs gathered table");
    expect_same_training(c2, e2, 1e-4, "compiled vs eager vocabulary-parallel ZeRO-3");
  }
}

TEST(CompiledFsdp, VocabParallelEmbeddingsTrainLikeTheGatheredTableOnTwoRanks) {
  if (is_rank_process()) return rank_body_vocab_parallel(2);
  run_compiled_ranks(2, 300s);
}

TEST(CompiledFsdp, VocabParallelEmbeddingsTrainLikeTheGatheredTableOnFourRanks) {
  if (is_rank_process()) return rank_body_vocab_parallel(4);
  run_compiled_ranks(4, 400s);
}

TEST(CompiledFsdp, TwoRanksTrainLikeEagerZeroThreeDdpAndOneProcess) {
  if (is_rank_process()) return rank_body_trains_like_eager(2);
  run_compiled_ranks(2, 300s);
}

TEST(CompiledFsdp, FourRanksTrainLikeEagerZeroThreeDdpAndOneProcess) {
  if (is_rank_process()) return rank_body_trains_like_eager(4);
  run_compiled_ranks(4, 400s);
}

// Gradient accumulation (each micro-batch's backward reduce-scatters, the averages add up in the shards' .grad),
// two forwards before one backward (the traced run gathers a resharded unit's bytes again for the second), and
// reduce_dtype bf16 (the unit's gradient rounded before its reduce-scatter), against eager ZeRO-3.
TEST(CompiledFsdp, AccumulationAndBf16ReductionFollowEagerZeroThree) {
  if (is_rank_process()) {
    const auto [ctx, cache] = join_compiled_ranks(kRankTimeout);
    const Trained eager2 = train(ctx, run(Mode::Eager3).micro_batches(2), cache);
    const Trained comp2 = train(ctx, run(Mode::Compiled3).micro_batches(2), cache);
    expect_same_training(comp2, eager2, 1e-4, "two micro-batches: compiled vs eager ZeRO-3");
    // Two forwards before one backward: each unit's weights are read by both forwards and gathered once for them.
    const Trained eager_sum = train(ctx, run(Mode::Eager3).micro_batches(2).summed_before_backward(), cache);
    const Trained comp_sum = train(ctx, run(Mode::Compiled3).micro_batches(2).summed_before_backward(), cache);
    expect_same_training(comp_sum, eager_sum, 1e-4, "two forwards, one backward: compiled vs eager ZeRO-3");
    expect_same_training(comp_sum, eager2, 1e-4, "two forwards, one backward vs a backward each");
    EXPECT_EQ(count_occurrences(comp2.stats.last_graph, "= reduce_scatter_start("), 2 * comp2.units)
        << "one per unit and backward";
    const Trained f32 = train(ctx, run(Mode::Eager3), cache);
    const Trained eager_bf = train(ctx, run(Mode::Eager3).reduce_in(DType::bf16), cache);
    const Trained comp_bf = train(ctx, run(Mode::Compiled3).reduce_in(DType::bf16), cache);
    expect_same_training(comp_bf, eager_bf, 1e-4, "bf16 reduction: compiled vs eager ZeRO-3");
    expect_same_training(comp_bf, f32, 1e-2, "bf16 reduction vs f32", false);
    bool differs = false;
    for (size_t k = 0; k < f32.params.size(); ++k)
      differs = differs || max_rel_error(comp_bf.params[k], f32.params[k], 1e-7, 1e-9) > 1.0;
    EXPECT_TRUE(differs) << "the bf16 reduction must round something (else this test checks nothing)";
    const std::string& g = comp_bf.stats.last_graph;
    EXPECT_NE(g.find("bf16[") , std::string::npos) << g;
    return;
  }
  run_compiled_ranks(2, 300s);
}

// BucketViewOptions::reduce_scatters (compile/passes/bucket_views.h, on by default): a unit's gradients are made in
// its reduce-scatter input, so no concatenation copies them, and training follows eager ZeRO-3. ZeRO-3 reduces no
// whole bucket, so every bucket_view in its graph is a unit's reduce-scatter input: one per unit that has gradients.
TEST(CompiledFsdp, UnitGradientsMadeInTheirReduceScatterInputFollowEagerZeroThree) {
  if (is_rank_process()) {
    const auto [ctx, cache] = join_compiled_ranks(kRankTimeout);
    const Trained eager = train(ctx, run(Mode::Eager3), cache);
    const Trained viewed = train(ctx, run(Mode::Compiled3), cache);
    expect_same_training(viewed, eager, 1e-4, "unit gradients in their reduce-scatter input vs eager ZeRO-3");
    const std::string& g = viewed.stats.last_graph;
    EXPECT_EQ(count_occurrences(g, "= bucket_view("), count_occurrences(g, "= reduce_scatter_start(")) << g;
    EXPECT_EQ(count_occurrences(g, "= cat("), 0u) << g;
    return;
  }
  run_compiled_ranks(2, 300s);
}

// Memory, from the CPU allocator on each rank after (and during) a compiled step: compiled DDP holds the weights
// and AdamW's two moments whole (~3x the weights; the gradients are graph values), compiled ZeRO-3 the shards and
// their moments (~3/world of the weights, plus the units' padding). The step's peak is lower too: DDP's holds every
// gradient at once on top, ZeRO-3's a few gathered units and one unit's gradients.
void rank_body_memory() {
  const auto [ctx, cache] = join_compiled_ranks(kRankTimeout);
  const int world = ctx.info.world_size;
  const Trained ddp = train(ctx, run(Mode::DdpCompiled).for_steps(3), cache);
  const Trained z3 = train(ctx, run(Mode::Compiled3).for_steps(3), cache);
  const Trained eager = train(ctx, run(Mode::Eager3).for_steps(3), cache);
  const Trained traced = train(ctx, run(Mode::Compiled3).for_steps(2).first_step_eager(), cache);
  int64_t weights = 0;
  for (const Tensor& p : ddp.params) weights += static_cast<int64_t>(p.nbytes());
  std::printf("[ fsdp     ] world %d: weights %lld B; held after a compiled step: DDP %lld, ZeRO-3 %lld; peak during "
              "it: DDP %lld, ZeRO-3 %lld; planned arena: DDP %lld, ZeRO-3 %lld\n",
              world, static_cast<long long>(weights), static_cast<long long>(ddp.held),
              static_cast<long long>(z3.held), static_cast<long long>(ddp.peak), static_cast<long long>(z3.peak),
              static_cast<long long>(ddp.stats.planned_peak_bytes),
              static_cast<long long>(z3.stats.planned_peak_bytes));
  const double w = static_cast<double>(weights), n = static_cast<double>(world);
  EXPECT_GT(static_cast<double>(ddp.held), 2.9 * w);
  EXPECT_LT(static_cast<double>(z3.held), 1.15 * static_cast<double>(ddp.held) / n);
  EXPECT_GT(static_cast<double>(z3.held), 0.85 * static_cast<double>(ddp.held) / n);
  EXPECT_LT(z3.peak, ddp.peak);
  // The step that traces runs eagerly and holds what an eager ZeRO-3 step holds (a resharded block's gathered
  // weights freed after its forward, gathered again before its backward), not the whole model. (Traced after an
  // eager step, so that both find the optimizer state allocated.) Measured on 2 ranks: 620 KB vs 565 KB (the
  // trace's .grad clones); 749 KB while the traced run kept every unit gathered and every .grad until the end.
  // Since Gloo averages in place (c6671d5: no temporary as large as the bucket) both are lower and the eager step
  // more so: 581 vs 504 KB on 2 ranks, 386 vs 333 KB on 4 (1.15-1.16, and the Gloo worker's timing moves either by
  // a few hundred bytes), so the bound is 1.25: the whole-model regression it guards against held ~1.33-1.49x.
  std::printf("[ fsdp     ] world %d: traced step peak %lld B, an eager ZeRO-3 step's %lld B\n", world,
              static_cast<long long>(traced.first_peak), static_cast<long long>(eager.peak));
  EXPECT_LT(static_cast<double>(traced.first_peak), 1.25 * static_cast<double>(eager.peak));
  // The planned arenas: since each unit's gradients are made in its reduce-scatter input (alive from the unit's
  // first gradient on, BucketViewOptions::reduce_scatters) ZeRO-3's is within 0.2% of DDP's on 2 ranks of this
  // small model (333,056 vs 332,416 B), below it on 4; a ZeRO-3 arena that held whole weights or gradients of
  // more than a few units would be well above.
  EXPECT_LT(static_cast<double>(z3.stats.planned_peak_bytes), 1.02 * static_cast<double>(ddp.stats.planned_peak_bytes));
}

TEST(CompiledFsdp, HoldsAboutOneNthOfDdpsBytesAndPeaksLower) {
  if (is_rank_process()) return rank_body_memory();
  run_compiled_ranks(2, 300s);
}

TEST(CompiledFsdp, HoldsAboutOneNthOfDdpsBytesAndPeaksLowerOnFourRanks) {
  if (is_rank_process()) return rank_body_memory();
  run_compiled_ranks(4, 400s);
}

// The schedule of a resharding step (compile/passes/unit_gathers.cpp): in the forward, block k+1's gather starts
// before block k's last reader of its weights and after block k-1's; in the backward the same in reverse order,
// and no block's backward gather starts before that block's forward ended; the embeddings' and the head's gathers
// read only where those are used. Graph structure only: the step runs
// node by node (CompileBackend::Eager, no code generation).
TEST(CompiledFsdp, EachUnitsGatherStartsWhileThePreviousUnitComputesAndNotEarlier) {
  if (is_rank_process()) {
    const auto ctx = join_compiled_ranks(kRankTimeout).ctx;
    const Trained comp = train(ctx, run(Mode::Compiled3).for_steps(2).node_by_node(), "");
    const std::string& g = comp.stats.last_graph;
    std::vector<Window> fwd, bwd, embed, head;
    for (const Window& w : windows(parse(g))) {
      if (w.unit == "embeddings" || w.unit == "head") {
        (w.unit == "head" ? head : embed).push_back(w);
        continue;
      }
      ASSERT_GE(w.first, 0) << w.unit << " is gathered but never read: " << g;
      (fwd.size() < 3 ? fwd : bwd).push_back(w);
    }
    if (ctx.info.rank == 0)
      for (const std::vector<Window>* ws : {&fwd, &bwd})
        for (const Window& w : *ws)
          std::printf("[ fsdp     ] %s %s: gather starts at op %d, its weights read at ops %d-%d\n", w.unit.c_str(),
                      ws == &fwd ? "forward" : "backward", w.start, w.first, w.last);
    ASSERT_EQ(fwd.size(), 3u) << g;
    ASSERT_EQ(bwd.size(), 3u) << g;
    std::sort(fwd.begin(), fwd.end(), [](const Window& a, const Window& b) { return a.first < b.first; });
    std::sort(bwd.begin(), bwd.end(), [](const Window& a, const Window& b) { return a.first < b.first; });
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(fwd[k].unit, "transformer.h." + std::to_string(k));
      EXPECT_EQ(bwd[k].unit, "transformer.h." + std::to_string(2 - k)) << "the backward runs the blocks in reverse";
      EXPECT_LT(fwd[k].last, bwd.back().first) << "forward windows end before the backward's";
    }
    for (const std::vector<Window>* ws : {&fwd, &bwd})
      for (size_t k = 1; k < 3; ++k) {
        const std::vector<Window>& w = *ws;
        EXPECT_LT(w[k].start, w[k - 1].last) << w[k].unit << "'s gather is prefetched while " << w[k - 1].unit
                                             << " computes\n" << g;
        EXPECT_LT(w[k].start, w[k].first) << g;
        if (k >= 2) {
          EXPECT_GT(w[k].start, w[k - 2].last) << w[k].unit << "'s gather is not issued before " << w[k - 2].unit
                                               << " finished\n" << g;
        }
      }
    // Resharding: the backward gathers the last block again only once its forward is over.
    EXPECT_GT(bwd[0].start, fwd[2].last) << g;
    // Note [Embeddings and head are units]: the embeddings' gathered weights die with the lookups, before block 0
    // computes; the head's are read from the last block's end to the head's backward; tied GPT-2 gathers the
    // embeddings again for the head, read there only, before the last block's backward.
    ASSERT_EQ(embed.size(), 2u) << g;
    ASSERT_EQ(head.size(), 1u) << g;
    std::sort(embed.begin(), embed.end(), [](const Window& a, const Window& b) { return a.first < b.first; });
    EXPECT_LT(embed[0].last, fwd[0].first) << g;
    EXPECT_GT(head[0].first, fwd[2].last) << g;
    EXPECT_LT(head[0].last, bwd[0].first) << g;
    EXPECT_GT(embed[1].first, fwd[2].last) << g;
    EXPECT_LT(embed[1].last, bwd[0].first) << g;
    // explain's collectives section (compile/explain.h: describe_collectives): every unit's collectives, and what
    // each overlaps: block 1's forward gather block 0's forward, block 1's reduce-scatter block 0's backward.
    const std::vector<std::string>& c = comp.stats.collectives;
    if (ctx.info.rank == 0)
      for (const std::string& line : c) std::printf("[ explain  ] %s\n", line.c_str());
    ASSERT_EQ(c.size(), 9u + 5u);
    auto line_of = [&](const std::string& what) {
      for (const std::string& l : c)
        if (l.find(what) != std::string::npos) return l;
      return std::string();
    };
    EXPECT_NE(line_of("all_gather of unit transformer.h.1 (weights for forward").find("overlaps"), std::string::npos);
    EXPECT_NE(line_of("all_gather of unit transformer.h.1 (weights for forward").find("transformer.h.0 forward"),
              std::string::npos);
    EXPECT_NE(line_of("all_gather of unit transformer.h.0 (weights again for backward").find("transformer.h.1 backward"),
              std::string::npos);
    EXPECT_NE(line_of("reduce_scatter of unit transformer.h.1").find("transformer.h.0 backward"), std::string::npos);
    // Note [Unit reductions are waited for a unit later]: block 2's reduce-scatter overlaps block 1's backward
    // and is waited for once block 1's reduce-scatter started, before block 0's backward.
    EXPECT_NE(line_of("reduce_scatter of unit transformer.h.2").find("transformer.h.1 backward"), std::string::npos);
    EXPECT_EQ(line_of("reduce_scatter of unit transformer.h.2").find("transformer.h.0 backward"), std::string::npos);
    return;
  }
  run_compiled_ranks(2, 120s);
}

// The unit reduce-scatters of the scheduled graph, in schedule order: the start's line, its input value, and the
// line of its own wait (the collective_wait whose first input is the start's result; a later input is a token).
struct Reduction {
  std::string unit;
  int start = -1, wait = -1, input = -1;
};

std::vector<Reduction> reductions(const std::vector<Line>& lines) {
  std::vector<Reduction> out;
  for (size_t s = 0; s < lines.size(); ++s) {
    if (lines[s].op != "reduce_scatter_start" || lines[s].attrs.find("unit=") == std::string::npos) continue;
    Reduction r;
    r.unit = lines[s].attrs.substr(lines[s].attrs.find("unit=") + 5);
    r.start = static_cast<int>(s);
    r.input = lines[s].ins.at(0);
    for (size_t i = s + 1; i < lines.size() && r.wait < 0; ++i)
      if (lines[i].op == "collective_wait" && !lines[i].ins.empty() && lines[i].ins[0] == lines[s].outs.at(0))
        r.wait = static_cast<int>(i);
    out.push_back(r);
  }
  return out;
}

// Note [Unit reductions are waited for a unit later] (compile/passes/unit_reductions.h) on the traced step: each
// unit's reduce-scatter is waited for right after the next unit's starts, never right after its own, so at most
// two units' flattened gradients (the starts' inputs, which the collectives hold until their waits) are alive at
// any op of the schedule. With CompileOptions::unit_reduction_lag 0 every wait comes after the whole backward and
// all five are alive at once. The same losses and weights either way. Node by node (no code generation).
TEST(CompiledFsdp, EachUnitsReduceScatterIsWaitedForOnceTheNextUnitsStarts) {
  if (is_rank_process()) {
    const auto ctx = join_compiled_ranks(kRankTimeout).ctx;
    const Trained bounded = train(ctx, run(Mode::Compiled3).for_steps(2).node_by_node(), "");
    const Trained at_end = train(ctx, run(Mode::Compiled3).for_steps(2).node_by_node().reductions_waited_after(0), "");
    expect_same_training(bounded, at_end, 1e-12, "reduce-scatters waited a unit later vs at the backward's end");
    auto most_alive = [](const std::vector<Reduction>& rs, size_t ops) {
      int most = 0;
      for (size_t i = 0; i < ops; ++i) {
        int alive = 0;
        for (const Reduction& r : rs) alive += r.start <= static_cast<int>(i) && static_cast<int>(i) < r.wait;
        most = std::max(most, alive);
      }
      return most;
    };
    const std::vector<Line> lines = parse(bounded.stats.last_graph);
    const std::vector<Reduction> rs = reductions(lines);
    ASSERT_EQ(rs.size(), bounded.units) << bounded.stats.last_graph;
    for (size_t k = 0; k < rs.size(); ++k) {
      ASSERT_GE(rs[k].wait, 0) << rs[k].unit << " is never waited for";
      if (ctx.info.rank == 0)
        std::printf("[ fsdp     ] reduce-scatter of %s: starts at op %d, waited at op %d\n", rs[k].unit.c_str(),
                    rs[k].start, rs[k].wait);
      if (k + 1 < rs.size()) {
        EXPECT_EQ(rs[k].wait, rs[k + 1].start + 1) << rs[k].unit << " is waited for right after " << rs[k + 1].unit
                                                   << "'s start\n" << bounded.stats.last_graph;
      }
      EXPECT_GT(rs[k].wait, rs[k].start + 1) << "a wait never directly follows its own start";
    }
    EXPECT_EQ(rs.front().unit, "head") << "the head's gradients are complete first";
    EXPECT_LE(most_alive(rs, lines.size()), 2) << bounded.stats.last_graph;
    const std::vector<Line> end_lines = parse(at_end.stats.last_graph);
    EXPECT_EQ(most_alive(reductions(end_lines), end_lines.size()), static_cast<int>(at_end.units))
        << at_end.stats.last_graph;
    return;
  }
  run_compiled_ranks(2, 120s);
}

}  // namespace
}  // namespace ingot::distributed
