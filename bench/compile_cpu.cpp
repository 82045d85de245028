// Compiled vs eager training step of a small GPT on the CPU, in one run (eager and compiled steps are timed
// interleaved, so a shared machine's load hits both alike):
//   bench_compile_cpu [--batch 8] [--seq 64] [--layers 4] [--embd 128] [--heads 4] [--vocab 256] [--steps 10]
// One step = forward, mean cross entropy, backward, AdamW, zero_grad, on a fixed batch of random tokens; the
// compiled step is the same function through ingot::compile (one graph). Reports the median step time of
// each (after 2 warm-up steps), their ratio, the cold compile time (empty kernel cache), the warm compile time
// (a second process with the cache filled: no C++ compiler runs), kernels generated / reused, launches per
// step, and the peak bytes the CPU allocator saw during one step of each (parameters and state included),
// next to the compiler's planned arena for intermediates.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "bench/cli.h"
#include "compile/api.h"
#include "compile/explain.h"
#include "models/gpt2.h"
#include "optim/optimizer.h"
#include "runtime/allocator.h"
#include "runtime/rng.h"

using namespace ingot;

namespace {

struct Args {
  int64_t batch = 8, seq = 64, layers = 4, embd = 128, heads = 4, vocab = 256, steps = 10;
  std::string warm_child;  // internal: cache dir for the warm-compile child process
};

Args parse(int argc, char** argv) {
  Args a;
  CLI::App app{"Compiled vs eager training step of a small GPT on the CPU: step times, cold and warm compile time, launches, peak bytes.",
               "bench_compile_cpu"};
  app.add_option("--batch", a.batch, "rows per step")->capture_default_str();
  app.add_option("--seq", a.seq, "tokens per row")->capture_default_str();
  app.add_option("--layers", a.layers, "transformer blocks")->capture_default_str();
  app.add_option("--embd", a.embd, "embedding width")->capture_default_str();
  app.add_option("--heads", a.heads, "attention heads")->capture_default_str();
  app.add_option("--vocab", a.vocab, "vocabulary size")->capture_default_str();
  app.add_option("--steps", a.steps, "timed steps")->capture_default_str();
  // Internal: the warm-compile child process this program starts on itself, with the cache dir to reuse.
  app.add_option("--warm-child", a.warm_child)->group("");
  bench::parse_or_exit(app, argc, argv);
  return a;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Setup {
  std::shared_ptr<models::GPT2> model;
  std::unique_ptr<optim::AdamW> opt;
  Tensor ids, tgt;
  CompiledFunction::Fn fn;
};

Setup make_setup(const Args& a) {
  manual_seed(0);
  models::GPT2Config c;
  c.vocab_size = a.vocab;
  c.n_positions = a.seq;
  c.n_embd = a.embd;
  c.n_layer = a.layers;
  c.n_head = a.heads;
  Setup s;
  s.model = std::make_shared<models::GPT2>(c);
  s.opt = std::make_unique<optim::AdamW>(s.model->parameters(), optim::AdamWOptions{1e-3, 0.9, 0.95, 1e-8, 0.1});
  s.ids = randint(0, a.vocab, {a.batch, a.seq});
  s.tgt = randint(0, a.vocab, {a.batch, a.seq});
  auto* model = s.model.get();
  auto* opt = s.opt.get();
  s.fn = [model, opt](const std::vector<Tensor>& b) {
    Tensor loss = model->loss(b[0], b[1]);
    loss.backward();
    opt->step();
    opt->zero_grad();
    return std::vector<Tensor>{loss};
  };
  return s;
}

template <class F>
std::pair<double, int64_t> time_steps(F&& step, int64_t steps) {
  std::vector<double> t;
  int64_t peak = 0;
  for (int64_t i = 0; i < steps + 2; ++i) {
    cpu_allocator().reset_peak();
    const double t0 = now_ms();
    step();
    const double dt = now_ms() - t0;
    peak = std::max(peak, cpu_allocator().stats().peak_allocated_bytes);
    if (i >= 2) t.push_back(dt);
  }
  return {median(t), peak};
}

// The warm-cache child: compile once against the filled cache and print one parsable line.
int warm_child(const Args& a) {
  Setup s = make_setup(a);
  CompileOptions o;
  o.cache_dir = a.warm_child;
  CompiledFunction step = compile(s.fn, o);
  const double t0 = now_ms();
  step({s.ids, s.tgt});
  const double first = now_ms() - t0;
  const CompileStats& st = step.stats();
  std::printf("WARM %.1f %.1f %lld %lld %lld\n", first, st.time.total_ms, static_cast<long long>(st.kernels_generated),
              static_cast<long long>(st.kernels_disk_hits), static_cast<long long>(st.kernels_reused));
  return 0;
}

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (!a.warm_child.empty()) return warm_child(a);
    char tmpl[] = "/tmp/ingot_bench_cache_XXXXXX";
    INGOT_CHECK(mkdtemp(tmpl) != nullptr, "bench_compile_cpu: cannot create a temporary cache directory");
    const std::string cache = tmpl;

    std::printf("bench_compile_cpu: GPT-2 layers=%lld embd=%lld heads=%lld vocab=%lld, batch %lld x seq %lld, "
                "AdamW, f32, CPU threads from OpenMP\n",
                static_cast<long long>(a.layers), static_cast<long long>(a.embd), static_cast<long long>(a.heads),
                static_cast<long long>(a.vocab), static_cast<long long>(a.batch), static_cast<long long>(a.seq));

    int64_t eager_peak = 0;
    {  // peaks are measured with one model alive at a time
      Setup eager = make_setup(a);
      eager_peak = time_steps([&] { eager.fn({eager.ids, eager.tgt}); }, 1).second;
    }

    // The same step with memory_budget 0.5: rematerialized activations and per-parameter updates.
    double budget_ms = 0;
    int64_t budget_peak = 0;
    {
      Setup b = make_setup(a);
      CompileOptions ob;
      ob.cache_dir = cache + "_budget";  // its own cache: the cold compile below stays cold
      ob.memory_budget = 0.5;
      CompiledFunction sb = compile(b.fn, ob);
      sb({b.ids, b.tgt});
      std::tie(budget_ms, budget_peak) = time_steps([&] { sb({b.ids, b.tgt}); }, 3);
    }

    Setup comp = make_setup(a);
    CompileOptions o;
    o.cache_dir = cache;
    CompiledFunction step = compile(comp.fn, o);
    const double t0 = now_ms();
    step({comp.ids, comp.tgt});
    const double cold_first_ms = now_ms() - t0;
    const CompileStats cold = step.stats();
    int64_t comp_peak = time_steps([&] { step({comp.ids, comp.tgt}); }, 1).second;

    // Step times: eager and compiled steps interleaved, so that both see the same load on a shared machine.
    Setup eager2 = make_setup(a);
    std::vector<double> te, tc;
    for (int64_t i = 0; i < a.steps + 2; ++i) {
      double t = now_ms();
      eager2.fn({eager2.ids, eager2.tgt});
      if (i >= 2) te.push_back(now_ms() - t);
      t = now_ms();
      step({comp.ids, comp.tgt});
      if (i >= 2) tc.push_back(now_ms() - t);
    }
    const double eager_ms = median(te), comp_ms = median(tc);

    // Warm compile: a second process over the filled cache.
    std::string cmd = std::string("\"") + argv[0] + "\" --warm-child \"" + cache + "\" --batch " +
                      std::to_string(a.batch) + " --seq " + std::to_string(a.seq) + " --layers " +
                      std::to_string(a.layers) + " --embd " + std::to_string(a.embd) + " --heads " +
                      std::to_string(a.heads) + " --vocab " + std::to_string(a.vocab);
    double warm_first = -1, warm_total = -1;
    long long warm_gen = -1, warm_disk = -1, warm_reused = -1;
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char line[512];
      while (std::fgets(line, sizeof line, p))
        if (std::sscanf(line, "WARM %lf %lf %lld %lld %lld", &warm_first, &warm_total, &warm_gen, &warm_disk,
                        &warm_reused) == 5)
          break;
      pclose(p);
    }

    const CompileStats& st = step.stats();
    std::printf("\n| measure | eager | compiled |\n|---|---|---|\n");
    std::printf("| step time (median of %lld) | %.1f ms | %.1f ms (eager/compiled = %.2fx) |\n",
                static_cast<long long>(a.steps), eager_ms, comp_ms, eager_ms / comp_ms);
    std::printf("| peak allocated during a step | %.2f MiB | %.2f MiB |\n", mib(eager_peak), mib(comp_peak));
    std::printf("| ops / launches per step | %lld ops (%lld not views) | %lld launches (%lld generated kernels + %lld "
                "extern ops; %lld fusion groups) |\n",
                static_cast<long long>(st.ops_before), static_cast<long long>(st.compute_ops),
                static_cast<long long>(st.launches), static_cast<long long>(st.kernels),
                static_cast<long long>(st.launches - st.kernels), static_cast<long long>(st.fused_groups));
    std::printf("| peak allocated, compiled with memory_budget 0.5 | - | %.2f MiB (%.1f ms/step) |\n", mib(budget_peak),
                budget_ms);
    std::printf("| planned arena for intermediates | - | %.2f MiB (%.2f MiB live at peak) |\n",
                mib(st.planned_peak_bytes), mib(st.unplanned_peak_bytes));
    std::printf("| cold compile (empty cache) | - | %.0f ms first call; trace %.0f, passes %.0f, lower %.0f, codegen "
                "%.0f ms; %lld kernels compiled |\n",
                cold_first_ms, cold.time.trace_ms, cold.time.passes_ms, cold.time.lower_ms, cold.time.codegen_ms,
                static_cast<long long>(cold.kernels_generated));
    std::printf("| warm compile (2nd process) | - | %.0f ms first call (compile %.0f ms); %lld compiled, %lld from "
                "disk cache |\n",
                warm_first, warm_total, warm_gen, warm_disk);
    std::printf("\n%s", explain_report(step).c_str());
    std::filesystem::remove_all(cache);
    std::filesystem::remove_all(cache + "_budget");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_compile_cpu: %s\n", e.what());
    return 1;
  }
}
