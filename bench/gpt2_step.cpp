// GPT-2 training-step benchmark, eager or compiled (the whole step traced into one graph by ingot::compile).
//   bench_gpt2_step [--device cuda|cpu] [--batch 16] [--seq 1024] [--layers 12] [--heads 12] [--embd 768]
//                   [--vocab 50304] [--steps 20] [--warmup 5] [--dtype bf16|f32]
//                   [--compile none|default|reduce-overhead|max-autotune|max-autotune-no-cudagraphs] [--cache-dir DIR] [--profile K]
//                   [--profiler-range] [--memory-budget B] [--losses] [--regional] [--peak-tflops P]
// --regional: compile with regional compilation (repeated blocks share their kernels), to compare its compile time
// and step time with the whole-step compile's.
// --peak-tflops P: the device's dense bf16 rate for the MFU column (default 989.4, an H100 / H200 SXM's datasheet
// rate); the column reads "-" on CPUs.
// --trained-head-in-chunks: the loss through linear_cross_entropy in chunks with the head's gradient made in the
// forward (Note [Logits in chunks], autograd/ops/loss.cpp), to measure its step time and peak against whole logits.
// --losses: also print every step's loss (warm-up included), to compare the trajectories of two modes.
// --memory-budget B: compile with CompileOptions::memory_budget = B (< 1 recomputes cheap saved activations in
// the backward, compile/passes/remat.cpp).
// --profiler-range: after the timed steps, one more step between cudaProfilerStart/Stop, for an external
// profiler started with profiling off (ncu --profile-from-start off; bench/reference/ncu_summary.py sums it).
// --profile K: after the timed steps, one more step under the op profiler (recipes/profile.h: the device is
// synchronized around every op or generated kernel) and the K most expensive ops / kernels; with
// --profile-events timed by CUDA events instead, nothing synchronized (Note [Ops timed on the device]): under
// `ingot launch` every rank runs the step and rank 0 prints its table.
// Compiled, the first call traces and compiles (its wall time is printed as the compile time; with a warm
// --cache-dir it measures the warm-cache compile) and counts as a warm-up step.
// One step = forward, mean cross entropy, backward, fused AdamW, zero_grad, on random tokens. bf16 means
// autocast-style mixed precision: f32 parameters and optimizer state, matmuls and attention in bf16, norms,
// softmax statistics and the loss in f32 (the same recipe as torch.autocast). GPU steps are timed with CUDA
// events around each step after warm-up; the median is reported. Prints one table row per configuration.
// Started by `ingot launch --nproc-per-node N -- bench_gpt2_step ...` (WORLD_SIZE > 1) the model is wrapped in
// DistributedDataParallel (NCCL on GPUs, Gloo on CPUs), --batch is per rank, and rank 0 prints tokens/s per rank.
// With --compile the bucket all-reduces are nodes of the compiled step's graph (distributed/collective_ops.h).
// DDP flags: --bucket-cap-mb MB, --reduce-dtype f32|bf16, --zero1, --one-update (one optimizer update after all
// reductions instead of the default one per bucket after its own reduction: CompileOptions::bucket_updates),
// --timeline (rank 0's communication per step from CUDA events: busy, exposed, compute; a 'timeline:' line, then one
// per collective with >= 0.05 ms exposed, the five longest: which collective the compute stream stood at),
// --sm-carveout N (the compute kernels leave N SMs to NCCL's: Note [SM carve-out], runtime/sm_budget.h; the row
// says " carveout N", also when INGOT_SM_CARVEOUT set it).
// Sharding: --zero-stage 1|2|3 (--zero1 is --zero-stage 1); 3 is FullyShardedDataParallel (eager, or with
// --compile its units' collectives in the graph: distributed/fsdp_compiled.h), with --keep-after-forward for
// reshard_after_forward false, --no-prefetch for the eager step without prefetched gathers (the row says
// " no prefetch"), and --unit-reduction-lag N for CompileOptions::unit_reduction_lag (compiled: each unit's
// reduce-scatter waited for N units later, 0 at the backward's end; the row says " unit lag N" unless 1).
// With f32 parameters (--dtype bf16 computes in bf16 from them) every stage all-gathers and updates f32 values;
// the row's peak memory is rank 0's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/cli.h"
#include "bench/step_bench.h"
#include "compile/api.h"
#include "distributed/bootstrap.h"
#include "distributed/ddp.h"
#include "models/gpt2.h"
#include "optim/optimizer.h"
#include "recipes/profile.h"
#include "runtime/cuda_runtime.h"
#include "runtime/rng.h"

using namespace ingot;

namespace {

struct Args {
  std::string device = "auto", dtype = "bf16", compile = "none", cache_dir;
  int64_t batch = 16, seq = 1024, layers = 12, heads = 12, embd = 768, vocab = 50304, steps = 20, warmup = 5;
  int64_t profile = 0;
  bool profiler_range = false, profile_events = false, losses = false, regional = false;
  bool timeline = false, timeline_slots = false, one_update = false, ddp_alone = false, keep_after_forward = false;
  bool prefetch = true, trained_head_in_chunks = false;
  int zero_stage = 0, unit_reduction_lag = 1, keep_last_blocks = 0;
  bool gather_embeddings = false;
  double bucket_cap_mb = distributed::DdpOptions{}.bucket_cap_mb;
  std::string reduce_dtype = "f32";
  std::string reduce_wire_dtype;
  double memory_budget = 1.0, peak_tflops = 989.4;
  int sm_carveout = 0;
  const CLI::Option* sm_carveout_flag = nullptr;
};

Args parse(int argc, char** argv) {
  Args a;
  CLI::App app{"GPT-2 training step benchmark (random weights and tokens).\n"
               "Prints a table row (median step time, tokens/s, TFLOP/s, MFU, peak memory, first call, loss)\n"
               "and, on GPUs, a 'timing:' line: host time per call, and the step queued back to back and after a\n"
               "5 ms rest.",
               "bench_gpt2_step"};
  app.add_option("--device", a.device, "auto, cpu or cuda")->capture_default_str();
  app.add_option("--dtype", a.dtype, "bf16 (autocast-style over f32 parameters) or f32")->capture_default_str();
  app.add_option("--batch", a.batch, "rows per step (per rank under ingot launch)")->capture_default_str();
  app.add_option("--seq", a.seq, "tokens per row")->capture_default_str();
  app.add_option("--layers", a.layers, "transformer blocks")->capture_default_str();
  app.add_option("--heads", a.heads, "attention heads")->capture_default_str();
  app.add_option("--embd", a.embd, "embedding width")->capture_default_str();
  app.add_option("--vocab", a.vocab, "vocabulary size")->capture_default_str();
  app.add_option("--steps", a.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed steps first (the first compiles)")->capture_default_str();
  app.add_option("--compile", a.compile, "none, default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs")
      ->capture_default_str();
  app.add_option("--cache-dir", a.cache_dir, "compile cache directory");
  app.add_option("--profile", a.profile, "after the timed steps, one more step under the op profiler: its K most expensive ops (0: none)")->capture_default_str();
  app.add_flag("--profile-events", a.profile_events,
               "--profile times ops by CUDA events on the stream, synchronizing nothing (ops overlap as unprofiled)");
  app.add_flag("--profiler-range", a.profiler_range, "after the timed steps, one more step between cudaProfilerStart/Stop (ncu --profile-from-start off)");
  app.add_option("--memory-budget", a.memory_budget, "compile.memory_budget (1: keep every saved value)")
      ->capture_default_str();
  app.add_flag("--losses", a.losses, "print every step's loss");
  app.add_flag("--regional", a.regional, "compile each transformer block as its own region");
  app.add_flag("--trained-head-in-chunks", a.trained_head_in_chunks,
               "the tied head's logits a chunk at a time, its gradient summed over the chunks in the forward "
               "(train.trained_head_in_chunks)");
  app.add_option("--peak-tflops", a.peak_tflops, "the GPU's dense bf16 peak, for MFU")->capture_default_str();
  const std::string dist = "Under ingot launch (DDP)";
  app.add_option("--bucket-cap-mb", a.bucket_cap_mb, "DDP bucket size")->capture_default_str()->group(dist);
  app.add_option("--reduce-dtype", a.reduce_dtype, "f32 or bf16: the dtype gradients are reduced in")
      ->capture_default_str()->group(dist);
  app.add_flag_callback("--zero1", [&a] { a.zero_stage = 1; }, "ZeRO-1 (the same as --zero-stage 1)")->group(dist);
  app.add_flag("--one-update", a.one_update, "one optimizer update after every bucket is reduced (not per bucket)")
      ->group(dist);
  app.add_flag("--timeline", a.timeline, "rank 0's communication per step (busy, exposed)")->group(dist);
  bench::add_timeline_slots_flag(app, a.timeline_slots, dist);
  app.add_flag("--ddp", a.ddp_alone, "DDP even in a world of one: its cost without peers")->group(dist);
  app.add_option("--zero-stage", a.zero_stage, "0 (DDP), 1, 2 or 3 (FSDP; eager or compiled)")
      ->capture_default_str()->group(dist);
  app.add_flag("--keep-after-forward", a.keep_after_forward, "ZeRO-3 without resharding after forward")->group(dist);
  bench::add_keep_last_blocks_option(app, a.keep_last_blocks, dist);
  bench::add_gather_embeddings_flag(app, a.gather_embeddings, dist);
  bench::add_reduce_wire_option(app, a.reduce_wire_dtype, dist);
  app.add_flag("--prefetch,!--no-prefetch", a.prefetch,
               "eager ZeRO-3: gather the next block while one computes (distributed.prefetch; default on)")
      ->group(dist);
  app.add_option("--unit-reduction-lag", a.unit_reduction_lag,
                 "compiled ZeRO-3: wait for each unit's reduce-scatter N units later (0: at the backward's end)")
      ->capture_default_str()->group(dist);
  a.sm_carveout_flag = bench::add_sm_carveout_flag(app, a.sm_carveout, dist);
  bench::parse_or_exit(app, argc, argv);
  INGOT_CHECK(a.peak_tflops > 0, "bench_gpt2_step: --peak-tflops must be positive, got ", a.peak_tflops);
  bench::check_ddp_flags("bench_gpt2_step", a.bucket_cap_mb, a.reduce_dtype);
  INGOT_CHECK(a.zero_stage >= 0 && a.zero_stage <= 3, "bench_gpt2_step: --zero-stage must be 0..3, got ", a.zero_stage);
  INGOT_CHECK(a.unit_reduction_lag >= 0, "bench_gpt2_step: --unit-reduction-lag must be >= 0, got ",
              a.unit_reduction_lag);
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  Args a = parse(argc, argv);
  // --ddp under `ingot launch --nproc-per-node 1`: the DDP step in a world of one (buckets, collectives, per-bucket
  // updates, no peers), what DDP costs beside the communication itself.
  bench::BenchWorld w = bench::join_world(a.device, a.ddp_alone);
  const int rank = w.rank;
  const Device dev = w.dev;
  bench::apply_sm_carveout(a.sm_carveout_flag, a.sm_carveout, dev);
  std::optional<distributed::DistributedContext>& dist = w.dist;
  manual_seed(1234 + static_cast<uint64_t>(rank));
  models::GPT2Config cfg;
  cfg.vocab_size = a.vocab;
  cfg.n_positions = a.seq;
  cfg.n_layer = a.layers;
  cfg.n_head = a.heads;
  cfg.n_embd = a.embd;
  models::GPT2 model(cfg);
  model.to(dev);
  if (a.dtype == "bf16") model.set_compute_dtype(DType::bf16);
  else INGOT_CHECK(a.dtype == "f32", "bench_gpt2_step: --dtype must be bf16 or f32, got ", a.dtype);
  model.set_trained_head_in_chunks(a.trained_head_in_chunks);
  bench::DataParallelStep dp;
  dp.reduce_wire_dtype = a.reduce_wire_dtype;
  dp.wrap(model, w, a.zero_stage, a.bucket_cap_mb, a.reduce_dtype, !a.keep_after_forward, true,
          a.prefetch && a.compile == "none", a.keep_last_blocks, a.gather_embeddings);  // compiled steps prefetch by their schedule
  optim::AdamW opt(dp.optimizer_params(model.parameters(), false), optim::AdamWOptions{6e-4, 0.9, 0.95, 1e-8, 0.1});

  Tensor data = randint(0, a.vocab, {a.batch, a.seq + 1}, dev);
  Tensor ids = contiguous(narrow(data, 1, 0, a.seq)), targets = contiguous(narrow(data, 1, 1, a.seq));
  // The step as one function: eager calls it directly, compiled modes trace it into one graph.
  auto step_fn = [&](const std::vector<Tensor>& b) {
    Tensor loss = model.loss(b[0], b[1]);
    loss.backward();
    dp.step(opt, model);
    return std::vector<Tensor>{loss};
  };
  std::optional<CompiledFunction> compiled;
  if (a.compile != "none") {
    CompileOptions o;
    const std::optional<CompileMode> mode = parse_compile_mode(a.compile);
    INGOT_CHECK(mode, "bench_gpt2_step: --compile must be none, default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs, got ",
                a.compile);
    o.mode = *mode;
    o.cache_dir = a.cache_dir;
    o.memory_budget = a.memory_budget;
    o.regional = a.regional;
    o.bucket_updates = !a.one_update;
    o.unit_reduction_lag = a.unit_reduction_lag;
    o.name = "gpt2_step";
    compiled = compile(step_fn, o);
  }
  if (dev.is_cuda()) allocator_for(dev).reset_peak();
  // --timeline: rank 0's communication per timed step (Note [Step timeline], distributed/nccl_process_group.cpp).
  std::vector<distributed::ProcessGroup::StepTimeline> marks;
  const bench::StepTimes t = bench::time_steps_with_timeline(
      dev, a.warmup, a.steps, [&] { return (compiled ? (*compiled)({ids, targets}) : step_fn({ids, targets}))[0]; },
      a.timeline && dist ? dist->group.get() : nullptr, &marks);
  const double med = t.median_ms(), compile_s = compiled ? t.first_call_s : 0.0;
  double tokens = static_cast<double>(a.batch * a.seq);
  // 6 * params * tokens for the matmuls plus the attention term 12 * L * T * C * tokens... per token: 6N + 6*L*T*C.
  double n_params = static_cast<double>(model.num_parameters());
  double flops = tokens * (6.0 * n_params + 6.0 * a.layers * a.seq * a.embd);
  AllocatorStats st = allocator_for(dev).stats();
  // The extra steps run on every rank (a data-parallel step's collectives need them all); rank 0 reports.
  if (a.profiler_range && dev.is_cuda()) {
    cuda::synchronize_device(dev.index);
    cuda::profiler_start();
    (compiled ? (*compiled)({ids, targets}) : step_fn({ids, targets}))[0].item();
    cuda::profiler_stop();
  }
  const std::string profile_table = bench::profile_one_step(dev, a.profile, a.profile_events, [&] {
    (compiled ? (*compiled)({ids, targets}) : step_fn({ids, targets}))[0].item();
  });
  if (rank != 0) return 0;
  std::string mode = compiled ? "ingot compile " + a.compile : std::string("ingot eager");
  if (compiled && a.regional) mode += " regional";
  mode += bench::ddp_label(w, a.zero_stage, a.reduce_dtype, a.bucket_cap_mb, a.one_update, !a.keep_after_forward,
                          a.keep_last_blocks, a.gather_embeddings, a.reduce_wire_dtype);
  if (!a.prefetch && a.zero_stage == 3 && a.compile == "none") mode += " no prefetch";
  if (compiled && w.dist && a.zero_stage == 3 && a.unit_reduction_lag != 1)
    mode += " unit lag " + std::to_string(a.unit_reduction_lag);
  mode += bench::carveout_label();
  std::printf("| mode | device | dtype | batch x seq | params | ms/step (median of %lld) | tokens/s | TFLOP/s | MFU | peak mem GB | "
              "first call s | loss first->last |\n",
              static_cast<long long>(a.steps));
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const double tflops = flops / (med / 1e3) / 1e12;
  const std::string mfu = dev.is_cuda() ? detail::str_cat(std::lround(100.0 * tflops / a.peak_tflops), "%") : "-";
  std::printf("| %s | %s | %s | %lld x %lld | %.1fM | %.2f | %.0f | %.1f | %s | %.2f | %.2f | %.3f -> %.3f |\n",
              mode.c_str(), dev.str().c_str(), a.dtype.c_str(), static_cast<long long>(a.batch),
              static_cast<long long>(a.seq), n_params / 1e6, med, tokens / (med / 1e3), tflops, mfu.c_str(),
              static_cast<double>(st.peak_allocated_bytes) / 1e9, compile_s, t.first_loss, t.last_loss);
  bench::print_step_timing(t);
  bench::print_timeline(marks, a.timeline_slots);
  if (a.losses) {
    std::printf("losses:");
    for (double l : t.losses) std::printf(" %.4f", l);
    std::printf("\n");
  }
  if (compiled) bench::print_compile_stats(compiled->stats());
  if (!profile_table.empty()) std::printf("%s", profile_table.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gpt2_step: error: %s\n", e.what());
  return 1;
}
