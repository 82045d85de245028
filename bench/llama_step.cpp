// Full fine-tune step benchmark of a Llama-architecture model built from a Hugging Face config.json with random
// weights (no checkpoint needed: the step's cost does not depend on the weights' values).
//   bench_llama_step --config bench/configs/llama_1b/config.json [--device cuda|cpu] [--batch 2] [--seq 2048]
//                    [--steps 20] [--warmup 5] [--dtype bf16|f32]
//                    [--compile none|default|reduce-overhead|max-autotune|max-autotune-no-cudagraphs]
//                    [--cache-dir DIR] [--layers N] [--memory-budget B]
// One step = forward, mean causal-LM cross entropy, backward, fused AdamW (f32 master weights and state),
// zero_grad, on random tokens: what `ingot run full_finetune` does per optimizer step. bf16 is autocast-style
// mixed precision (matmuls and attention in bf16; norms, softmax statistics and the loss in f32).
// bench/reference/hf_llama.py runs transformers' LlamaForCausalLM the same way for comparison.
// Under `ingot launch --nproc-per-node N` (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel (NCCL),
// --batch is per rank, and rank 0 prints the row (tokens/s per rank); --timeline adds rank 0's communication
// per step (busy, exposed), and --sm-carveout N leaves N SMs to NCCL's kernels, as bench_gpt2_step does.
// Sharding: --zero-stage 1|2|3 (3: FullyShardedDataParallel, eager or compiled; --keep-after-forward for
// reshard_after_forward false; eager, --no-prefetch without the prefetched gathers, the row saying " no
// prefetch"; compiled, --unit-reduction-lag N waits for each unit's reduce-scatter N units later,
// CompileOptions::unit_reduction_lag, 0 at the backward's end, and the row says " unit lag N" unless 1);
// --params bf16 holds the weights (ZeRO-3: their shards, gathered in bf16) in bf16 with f32 masters the optimizer
// updates, as `ingot run full_finetune dtype=bf16` and FSDP2's MixedPrecisionPolicy(param_dtype=bf16) do;
// --reduce-dtype f32 reduces gradients in f32 (FSDP2's reduce_dtype).
// The same weights and tokens as bench/reference/fsdp2_llama.py: --checkpoint DIR (an HF checkpoint; under ZeRO-3
// each rank reads only its shards' slices, models::HFSliceReader) and --tokens FILE (int32 ids in rows of seq + 1;
// rank r's rows of call k are (k * world + r) * batch .. + batch - 1, modulo the rows, as the reference reads
// them). --losses K prints the row in fsdp2_llama.py's columns (tokens/s and TFLOP/s per GPU, MFU against
// --peak-tflops, peak memory as the maximum over ranks, first step, build + shard time) with the first K losses
// of the global batch (the mean over ranks).
// --profile K [--profile-events]: after the timed steps one more step under the op profiler, its K most expensive
// ops, as bench_gpt2_step prints them (with --profile-events timed by CUDA events, nothing synchronized).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "autograd/nn/layers.h"
#include "bench/cli.h"
#include "bench/step_bench.h"
#include "compile/api.h"
#include "distributed/bootstrap.h"
#include "distributed/ddp.h"
#include "models/hf_checkpoint.h"
#include "models/hf_config.h"
#include "optim/optimizer.h"
#include "runtime/rng.h"

using namespace ingot;

namespace {

struct Args {
  std::string config, device = "auto", dtype = "bf16", compile = "none", cache_dir, checkpoint, tokens;
  std::string params = "f32";
  int64_t batch = 2, seq = 2048, steps = 20, warmup = 5, layers = 0, losses = 0;
  int zero_stage = 0, unit_reduction_lag = 1, keep_last_blocks = 0;
  double memory_budget = 1.0;
  bool gather_embeddings = false;
  bool timeline = false, timeline_slots = false, keep_after_forward = false, prefetch = true, profile_events = false;
  int64_t profile = 0;
  double peak_tflops = 989.4;
  double bucket_cap_mb = distributed::DdpOptions{}.bucket_cap_mb;
  std::string reduce_dtype = "f32";
  std::string reduce_wire_dtype;
  int sm_carveout = 0;
  const CLI::Option* sm_carveout_flag = nullptr;
  bool ddp_alone = false;
};

Args parse(int argc, char** argv) {
  Args a;
  CLI::App app{"Full fine-tune step benchmark of a Llama-architecture model (random weights unless --checkpoint).\n"
               "Prints a table row (median step time, tokens/s, peak memory, first-call time, loss) and, on GPUs, a\n"
               "'timing:' line: host time per call, and the step queued back to back and after a 5 ms rest.",
               "bench_llama_step"};
  app.add_option("--config", a.config, "Hugging Face config.json of the model (default: --checkpoint's)");
  app.add_option("--device", a.device, "auto, cpu or cuda")->capture_default_str();
  app.add_option("--dtype", a.dtype, "bf16 (autocast-style mixed precision) or f32")->capture_default_str();
  app.add_option("--batch", a.batch, "rows per step (per rank under ingot launch)")->capture_default_str();
  app.add_option("--seq", a.seq, "tokens per row")->capture_default_str();
  app.add_option("--steps", a.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed steps first (the first compiles)")->capture_default_str();
  app.add_option("--layers", a.layers, "override num_hidden_layers (0: the config's)")->capture_default_str();
  app.add_option("--compile", a.compile, "none, default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs")
      ->capture_default_str();
  app.add_option("--cache-dir", a.cache_dir, "compile cache directory");
  app.add_option("--memory-budget", a.memory_budget,
                 "compile.memory_budget: < 1 recomputes cheap saved activations in the backward (1: keep them all)")
      ->capture_default_str();
  app.add_option("--params", a.params, "f32, or bf16 (bf16 weights, f32 masters)")->capture_default_str();
  app.add_option("--checkpoint", a.checkpoint, "an HF checkpoint directory to load (ZeRO-3: each rank reads its slices)");
  app.add_option("--tokens", a.tokens, "int32 token ids in rows of seq + 1 (fsdp2_llama.py --make-tokens)");
  app.add_option("--losses", a.losses, "print the first K losses in fsdp2_llama.py's columns")->capture_default_str();
  app.add_option("--profile", a.profile,
                 "after the timed steps, one more step under the op profiler: its K most expensive ops (0: none)")
      ->capture_default_str();
  app.add_flag("--profile-events", a.profile_events,
               "--profile times ops by CUDA events on the stream, synchronizing nothing (ops overlap as unprofiled)");
  app.add_option("--peak-tflops", a.peak_tflops, "the GPU's dense bf16 peak, for MFU")->capture_default_str();
  const std::string dist = "Under ingot launch";
  app.add_flag("--timeline", a.timeline, "rank 0's communication per step (busy, exposed)")->group(dist);
  app.add_flag("--ddp", a.ddp_alone, "DDP even in a world of one (under ingot launch): its cost without peers")
      ->group(dist);
  bench::add_timeline_slots_flag(app, a.timeline_slots, dist);
  app.add_option("--bucket-cap-mb", a.bucket_cap_mb, "DDP bucket size")->capture_default_str()->group(dist);
  app.add_option("--reduce-dtype", a.reduce_dtype, "f32 or bf16: the dtype gradients are reduced in")
      ->capture_default_str()->group(dist);
  app.add_option("--zero-stage", a.zero_stage, "0 (DDP), 1, 2 or 3 (FSDP; eager or compiled)")
      ->capture_default_str()->group(dist);
  app.add_flag("--keep-after-forward", a.keep_after_forward, "ZeRO-3: keep a block's weights from forward to backward")
      ->group(dist);
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
  if (a.config.empty() && !a.checkpoint.empty()) a.config = a.checkpoint + "/config.json";
  INGOT_CHECK(!a.config.empty(),
              "bench_llama_step: --config CONFIG_JSON (or --checkpoint DIR) is required (see --help)");
  bench::check_ddp_flags("bench_llama_step", a.bucket_cap_mb, a.reduce_dtype);
  INGOT_CHECK(a.zero_stage >= 0 && a.zero_stage <= 3, "bench_llama_step: --zero-stage must be 0..3, got ",
              a.zero_stage);
  INGOT_CHECK(a.unit_reduction_lag >= 0, "bench_llama_step: --unit-reduction-lag must be >= 0, got ",
              a.unit_reduction_lag);
  INGOT_CHECK(a.params == "f32" || a.params == "bf16", "bench_llama_step: --params must be f32 or bf16, got ",
              a.params);
  INGOT_CHECK(a.params == "f32" || a.dtype == "bf16",
              "bench_llama_step: --params bf16 computes in bf16 (--dtype bf16)");
  INGOT_CHECK(a.peak_tflops > 0, "bench_llama_step: --peak-tflops must be positive, got ", a.peak_tflops);
  return a;
}


std::string fixed4(double v) {  // as fsdp2_llama.py prints its losses
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

// --tokens: the whole file as rows of seq + 1 ids.
std::vector<int32_t> read_token_rows(const std::string& path, int64_t seq, int64_t need) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  INGOT_CHECK(in, "bench_llama_step: cannot open --tokens file '", path, "'");
  const int64_t bytes = static_cast<int64_t>(in.tellg());
  const int64_t rows = bytes / static_cast<int64_t>(sizeof(int32_t)) / (seq + 1);
  INGOT_CHECK(rows >= need, "bench_llama_step: ", path, " holds ", rows, " rows of ", seq + 1, " int32 ids, need ",
              need, " (world x batch)");
  std::vector<int32_t> ids(static_cast<size_t>(rows * (seq + 1)));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(ids.size() * sizeof(int32_t)));
  INGOT_CHECK(in, "bench_llama_step: cannot read ", path);
  return ids;
}

}  // namespace

int main(int argc, char** argv) try {
  Args a = parse(argc, argv);
  bench::BenchWorld w = bench::join_world(a.device, a.ddp_alone);
  const int rank = w.rank;
  const Device dev = w.dev;
  bench::apply_sm_carveout(a.sm_carveout_flag, a.sm_carveout, dev);
  std::optional<distributed::DistributedContext>& dist = w.dist;
  const bool fsdp = dist && a.zero_stage == 3, bf16_params = a.params == "bf16";
  manual_seed(1234 + static_cast<uint64_t>(rank));
  const auto t_build = std::chrono::steady_clock::now();
  models::HFConfig hf = models::load_hf_config(a.config);
  INGOT_CHECK(hf.arch == models::HFConfig::Arch::Llama, "bench_llama_step: ", a.config,
              ": model_type must be llama, mistral or qwen2, got ", hf.model_type);
  if (a.layers > 0) hf.llama.num_hidden_layers = a.layers;
  std::shared_ptr<models::CausalLM> model;
  {
    // A checkpoint writes every parameter (ZeRO-3: its shards' slices): built undrawn in the parameters' dtype
    // (Note [Parameters made to be overwritten]), under ZeRO-3 without bytes on the device (Note [Parameters
    // without bytes], distributed/fsdp.h: the model is never whole on a rank); random weights otherwise, in f32.
    std::optional<nn::SkipInit> skip;
    const DType param_dtype = bf16_params ? DType::bf16 : DType::f32;
    if (!a.checkpoint.empty() && fsdp) skip.emplace(param_dtype, dev);
    else if (!a.checkpoint.empty()) skip.emplace(param_dtype);
    model = models::make_causal_lm(hf);
  }
  if (bf16_params) model->to(DType::bf16);  // on the CPU first: the device never holds the f32 model
  // ZeRO-3 reads its shards' slices after wrapping; anything else loads the whole checkpoint here.
  std::unique_ptr<models::HFSliceReader> slices;
  if (!a.checkpoint.empty() && fsdp) slices = std::make_unique<models::HFSliceReader>(*model, hf, a.checkpoint);
  else if (!a.checkpoint.empty()) models::load_hf_weights(*model, hf, a.checkpoint);
  model->to(dev);
  INGOT_CHECK(a.dtype == "bf16" || a.dtype == "f32", "bench_llama_step: --dtype must be bf16 or f32, got ", a.dtype);
  if (a.dtype == "bf16" && !bf16_params) model->set_compute_dtype(DType::bf16);
  std::vector<std::string> names;  // parameter i's name, tied ones once (FullyShardedDataParallel's numbering)
  {
    std::vector<const TensorImpl*> seen;
    for (const auto& [name, p] : model->named_parameters()) {
      if (std::find(seen.begin(), seen.end(), p.impl()) != seen.end()) continue;
      seen.push_back(p.impl());
      names.push_back(name);
    }
  }
  bench::DataParallelStep dp;
  dp.reduce_wire_dtype = a.reduce_wire_dtype;
  dp.wrap(*model, w, a.zero_stage, a.bucket_cap_mb, a.reduce_dtype, !a.keep_after_forward, /*broadcast=*/!slices,
          a.prefetch && a.compile == "none", a.keep_last_blocks, a.gather_embeddings);  // compiled steps prefetch by their schedule
  if (slices)
    dp.fsdp->load_shards(
        [&](size_t i, int64_t begin, int64_t end, Tensor& dst) { slices->read(names[i], begin, end, dst); });
  if (dev.is_cuda()) cuda::synchronize_device(dev.index);
  const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_build).count();
  optim::AdamW opt(dp.optimizer_params(model->parameters(), bf16_params),
                   optim::AdamWOptions{2e-5, 0.9, 0.95, 1e-8, 0.0});

  const int64_t vocab = hf.vocab_size();
  Tensor data = randint(0, vocab, {a.batch, a.seq + 1}, dev);
  Tensor ids = contiguous(narrow(data, 1, 0, a.seq)), targets = contiguous(narrow(data, 1, 1, a.seq));
  std::vector<int32_t> rows;
  if (!a.tokens.empty()) rows = read_token_rows(a.tokens, a.seq, w.world * a.batch);
  int64_t call = 0;  // --tokens: every call takes the next global batch
  auto next_batch = [&]() -> std::vector<Tensor> {
    if (rows.empty()) return {ids, targets};
    const int64_t n_rows = static_cast<int64_t>(rows.size()) / (a.seq + 1);
    std::vector<int64_t> x, y;
    for (int64_t b = 0; b < a.batch; ++b) {
      const int64_t row = ((call * w.world + rank) * a.batch + b) % n_rows;
      const int32_t* r = rows.data() + row * (a.seq + 1);
      for (int64_t t = 0; t < a.seq; ++t) {
        x.push_back(r[t]);
        y.push_back(r[t + 1]);
      }
    }
    ++call;
    return {from_vector_i64(x, {a.batch, a.seq}).to(dev), from_vector_i64(y, {a.batch, a.seq}).to(dev)};
  };
  auto step_fn = [&](const std::vector<Tensor>& b) {
    Tensor loss = model->loss(b[0], b[1]);
    loss.backward();
    dp.step(opt, *model);
    return std::vector<Tensor>{loss};
  };
  std::optional<CompiledFunction> compiled;
  if (a.compile != "none") {
    CompileOptions o;
    const std::optional<CompileMode> mode = parse_compile_mode(a.compile);
    INGOT_CHECK(mode,
                "bench_llama_step: --compile must be none, default, reduce-overhead, max-autotune or "
                "max-autotune-no-cudagraphs, got ",
                a.compile);
    o.mode = *mode;
    o.cache_dir = a.cache_dir;
    o.unit_reduction_lag = a.unit_reduction_lag;
    o.memory_budget = a.memory_budget;
    o.name = "llama_step";
    compiled = compile(step_fn, o);
  }
  if (dev.is_cuda()) allocator_for(dev).reset_peak();
  std::vector<distributed::ProcessGroup::StepTimeline> marks;
  const bool global_loss = a.losses > 0 && dist;
  const bench::StepTimes t = bench::time_steps_with_timeline(
      dev, a.warmup, a.steps,
      [&] {
        const std::vector<Tensor> b = next_batch();
        Tensor loss = (compiled ? (*compiled)(b) : step_fn(b))[0];
        if (!global_loss) return loss;
        // The mean over ranks: the global batch's loss, as fsdp2_llama.py prints it.
        Tensor l = reshape(loss.detach(), {1}).contiguous_raw();
        dist->group->all_reduce(l, distributed::ReduceOp::Avg)->wait();
        return l;
      },
      a.timeline && dist ? dist->group.get() : nullptr, &marks);
  const std::string profile_table = bench::profile_one_step(dev, a.profile, a.profile_events, [&] {
    const std::vector<Tensor> b = next_batch();
    (compiled ? (*compiled)(b) : step_fn(b))[0].item();
  });
  const double med = t.median_ms();
  const double tokens = static_cast<double>(a.batch * a.seq);
  const models::LlamaConfig& c = hf.llama;
  const double n_params = static_cast<double>(model->num_parameters());
  const int64_t head_dim = c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads;
  // 6N per token for the weights plus 6 * L * T * (heads * head_dim) for attention's two matmuls.
  const double flops = tokens * (6.0 * n_params + 6.0 * c.num_hidden_layers * a.seq * c.num_attention_heads * head_dim);
  const AllocatorStats st = allocator_for(dev).stats();
  double peak_gb = static_cast<double>(st.peak_allocated_bytes) / 1e9;
  // The first step's peak too: a compiled step's first call traces eagerly, which no later step repeats, but the
  // run must fit it.
  double first_peak_gb = static_cast<double>(t.first_peak_bytes) / 1e9;
  if (dist && a.losses > 0) {  // the maximum over ranks (every rank takes part)
    Tensor p = from_vector(std::vector<double>{peak_gb, first_peak_gb}, {2}, DType::f64, dev);
    dist->group->all_reduce(p, distributed::ReduceOp::Max)->wait();
    const Tensor h = p.to(Device::cpu());
    peak_gb = h.item_at(0);
    first_peak_gb = h.item_at(1);
  }
  if (rank != 0) return 0;
  std::string mode = compiled ? "ingot compile " + a.compile : std::string("ingot eager");
  mode += bench::ddp_label(w, a.zero_stage, a.reduce_dtype, a.bucket_cap_mb, false, !a.keep_after_forward,
                          a.keep_last_blocks, a.gather_embeddings, a.reduce_wire_dtype);
  if (!a.prefetch && a.zero_stage == 3 && a.compile == "none") mode += " no prefetch";
  if (compiled && dist && a.zero_stage == 3 && a.unit_reduction_lag != 1)
    mode += " unit lag " + std::to_string(a.unit_reduction_lag);
  if (compiled && a.memory_budget < 1.0) {
    char b[32];
    std::snprintf(b, sizeof b, " memory budget %.2f", a.memory_budget);
    mode += b;
  }
  mode += bench::carveout_label();
  if (bf16_params) mode += " bf16 params + f32 masters";
  const double tflops = flops / (med / 1e3) / 1e12;
  if (a.losses > 0) {  // fsdp2_llama.py's columns
    std::printf(
        "| mode | device | dtype | batch x seq per GPU | params | ms/step (median) | tokens/s per GPU | TFLOP/s "
        "per GPU | MFU | peak mem GB (max over ranks) | first step s | build + shard s | losses of the first "
        "steps |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::string losses;
    for (size_t i = 0; i < t.losses.size() && static_cast<int64_t>(i) < a.losses; ++i)
      losses += detail::str_cat(i ? " " : "", fixed4(t.losses[i]));
    std::printf("| %s | %s | %s | %lld x %lld | %.1fM | %.2f | %.0f | %.1f | %.1f%% | %.2f | %.2f | %.1f | %s |\n",
                mode.c_str(), dev.str().c_str(), a.dtype.c_str(), static_cast<long long>(a.batch),
                static_cast<long long>(a.seq), n_params / 1e6, med, tokens / (med / 1e3), tflops,
                100.0 * tflops / a.peak_tflops, peak_gb, t.first_call_s, build_s, losses.c_str());
  } else {
    std::printf("| mode | device | dtype | batch x seq | params | ms/step (median of %lld) | tokens/s | TFLOP/s | "
                "peak mem GB | first call s | loss first->last |\n",
                static_cast<long long>(a.steps));
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::printf("| %s | %s | %s | %lld x %lld | %.1fM | %.2f | %.0f | %.1f | %.2f | %.2f | %.3f -> %.3f |\n",
                mode.c_str(), dev.str().c_str(), a.dtype.c_str(), static_cast<long long>(a.batch),
                static_cast<long long>(a.seq), n_params / 1e6, med, tokens / (med / 1e3), tflops, peak_gb,
                compiled ? t.first_call_s : 0.0, t.first_loss, t.last_loss);
  }
  bench::print_step_timing(t);
  if (dev.is_cuda())
    std::printf("first step: peak %.2f GB (max over ranks; the table's peak is the later steps')\n", first_peak_gb);
  bench::print_timeline(marks, a.timeline_slots);
  if (compiled) bench::print_compile_stats(compiled->stats());
  if (!profile_table.empty()) std::printf("%s", profile_table.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_llama_step: error: %s\n", e.what());
  return 1;
}
