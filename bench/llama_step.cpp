// Full fine-tune step benchmark of a Llama-architecture model built from a Hugging Face config.json with random
// weights (no checkpoint needed: the step's cost does not depend on the weights' values).
//   bench_llama_step --config bench/configs/llama_1b/config.json [--device cuda|cpu] [--batch 2] [--seq 2048]
//                    [--steps 20] [--warmup 5] [--dtype bf16|f32] [--compile none|default|reduce-overhead|max-autotune|max-autotune-no-cudagraphs]
//                    [--cache-dir DIR] [--layers N]
// One step = forward, mean causal-LM cross entropy, backward, fused AdamW (f32 master weights and state),
// zero_grad, on random tokens: what `ingot run full_finetune` does per optimizer step. bf16 is autocast-style
// mixed precision (matmuls and attention in bf16; norms, softmax statistics and the loss in f32).
// bench/reference/hf_llama.py runs transformers' LlamaForCausalLM the same way for comparison.
// Under `ingot launch --nproc-per-node N` (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel (NCCL),
// --batch is per rank, and rank 0 prints the row (tokens/s per rank); --timeline adds rank 0's communication
// per step (busy, exposed), as bench_gpt2_step does.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "bench/step_bench.h"
#include "compile/api.h"
#include "distributed/bootstrap.h"
#include "distributed/ddp.h"
#include "models/hf_config.h"
#include "optim/optimizer.h"
#include "runtime/rng.h"

using namespace ingot;

namespace {

struct Args {
  std::string config, device = "auto", dtype = "bf16", compile = "none", cache_dir;
  int64_t batch = 2, seq = 2048, steps = 20, warmup = 5, layers = 0;
  bool timeline = false;
  double bucket_cap_mb = 25.0;
  std::string reduce_dtype = "f32";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf("usage: bench_llama_step --config CONFIG_JSON [--device auto|cpu|cuda] [--dtype bf16|f32]\n"
                  "       [--batch N] [--seq N] [--steps N] [--warmup N] [--layers N (override num_hidden_layers)]\n"
                  "       [--compile none|default|reduce-overhead|max-autotune|max-autotune-no-cudagraphs] [--cache-dir DIR]\n"
                  "       under ingot launch: [--timeline] [--bucket-cap-mb MB] [--reduce-dtype f32|bf16]\n"
                  "Prints a table row (median step time, tokens/s, peak memory, first-call time, loss) and, on GPUs, a\n"
                  "'timing:' line: host time per call, and the step queued back to back and after a 5 ms rest.\n");
      std::exit(0);
    }
    if (k == "--timeline") {
      a.timeline = true;
      continue;
    }
    INGOT_CHECK(i + 1 < argc, "bench_llama_step: flag ", k, " needs a value");
    std::string v = argv[++i];
    if (k == "--config") a.config = v;
    else if (k == "--device") a.device = v;
    else if (k == "--dtype") a.dtype = v;
    else if (k == "--batch") a.batch = std::stoll(v);
    else if (k == "--seq") a.seq = std::stoll(v);
    else if (k == "--steps") a.steps = std::stoll(v);
    else if (k == "--warmup") a.warmup = std::stoll(v);
    else if (k == "--layers") a.layers = std::stoll(v);
    else if (k == "--compile") a.compile = v;
    else if (k == "--cache-dir") a.cache_dir = v;
    else if (k == "--bucket-cap-mb") a.bucket_cap_mb = std::stod(v);
    else if (k == "--reduce-dtype") a.reduce_dtype = v;
    else INGOT_FAIL("bench_llama_step: unknown flag ", k, " (see --help)");
  }
  INGOT_CHECK(!a.config.empty(), "bench_llama_step: --config CONFIG_JSON is required (see --help)");
  bench::check_ddp_flags("bench_llama_step", a.bucket_cap_mb, a.reduce_dtype);
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  Args a = parse(argc, argv);
  bench::BenchWorld w = bench::join_world(a.device);
  const int rank = w.rank;
  const Device dev = w.dev;
  std::optional<distributed::DistributedContext>& dist = w.dist;
  manual_seed(1234 + static_cast<uint64_t>(rank));
  models::HFConfig hf = models::load_hf_config(a.config);
  INGOT_CHECK(hf.arch == models::HFConfig::Arch::Llama, "bench_llama_step: ", a.config,
              ": model_type must be llama, mistral or qwen2, got ", hf.model_type);
  if (a.layers > 0) hf.llama.num_hidden_layers = a.layers;
  std::shared_ptr<models::CausalLM> model = models::make_causal_lm(hf);
  model->to(dev);
  if (a.dtype == "bf16") model->set_compute_dtype(DType::bf16);
  else INGOT_CHECK(a.dtype == "f32", "bench_llama_step: --dtype must be bf16 or f32, got ", a.dtype);
  std::unique_ptr<distributed::DistributedDataParallel> ddp;
  if (dist)
    ddp = std::make_unique<distributed::DistributedDataParallel>(*model, dist->group,
                                                                 bench::ddp_options(a.bucket_cap_mb, a.reduce_dtype));
  optim::AdamW opt(ddp ? ddp->optimizer_params() : model->parameters(), optim::AdamWOptions{2e-5, 0.9, 0.95, 1e-8, 0.0});

  const int64_t vocab = hf.vocab_size();
  Tensor data = randint(0, vocab, {a.batch, a.seq + 1}, dev);
  Tensor ids = contiguous(narrow(data, 1, 0, a.seq)), targets = contiguous(narrow(data, 1, 1, a.seq));
  auto step_fn = [&](const std::vector<Tensor>& b) {
    Tensor loss = model->loss(b[0], b[1]);
    loss.backward();
    bench::optimizer_step(ddp.get(), opt);
    return std::vector<Tensor>{loss};
  };
  std::optional<CompiledFunction> compiled;
  if (a.compile != "none") {
    CompileOptions o;
    const std::optional<CompileMode> mode = parse_compile_mode(a.compile);
    INGOT_CHECK(mode, "bench_llama_step: --compile must be none, default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs, got ",
                a.compile);
    o.mode = *mode;
    o.cache_dir = a.cache_dir;
    o.name = "llama_step";
    compiled = compile(step_fn, o);
  }
  if (dev.is_cuda()) allocator_for(dev).reset_peak();
  std::vector<distributed::ProcessGroup::StepTimeline> marks;
  const bench::StepTimes t = bench::time_steps_with_timeline(
      dev, a.warmup, a.steps, [&] { return (compiled ? (*compiled)({ids, targets}) : step_fn({ids, targets}))[0]; },
      a.timeline && dist ? dist->group.get() : nullptr, &marks);
  const double med = t.median_ms();
  const double tokens = static_cast<double>(a.batch * a.seq);
  const models::LlamaConfig& c = hf.llama;
  const double n_params = static_cast<double>(model->num_parameters());
  const int64_t head_dim = c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads;
  // 6N per token for the weights plus 6 * L * T * (heads * head_dim) for attention's two matmuls.
  const double flops = tokens * (6.0 * n_params + 6.0 * c.num_hidden_layers * a.seq * c.num_attention_heads * head_dim);
  const AllocatorStats st = allocator_for(dev).stats();
  if (rank != 0) return 0;
  std::string mode = compiled ? "ingot compile " + a.compile : std::string("ingot eager");
  mode += bench::ddp_label(w, false, a.reduce_dtype, a.bucket_cap_mb);
  std::printf("| mode | device | dtype | batch x seq | params | ms/step (median of %lld) | tokens/s | TFLOP/s | "
              "peak mem GB | first call s | loss first->last |\n",
              static_cast<long long>(a.steps));
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| %s | %s | %s | %lld x %lld | %.1fM | %.2f | %.0f | %.1f | %.2f | %.2f | %.3f -> %.3f |\n",
              mode.c_str(), dev.str().c_str(), a.dtype.c_str(), static_cast<long long>(a.batch),
              static_cast<long long>(a.seq), n_params / 1e6, med, tokens / (med / 1e3), flops / (med / 1e3) / 1e12,
              static_cast<double>(st.peak_allocated_bytes) / 1e9, compiled ? t.first_call_s : 0.0, t.first_loss,
              t.last_loss);
  bench::print_step_timing(t);
  bench::print_timeline(marks);
  if (compiled) bench::print_compile_stats(compiled->stats());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_llama_step: error: %s\n", e.what());
  return 1;
}
