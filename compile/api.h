// ingot::compiler: compiles a whole training step.
//
//   auto step = ingot::compiler([&](const std::vector<Tensor>& batch) {
//     Tensor loss = model.loss(batch[0], batch[1]);
//     loss.backward();
//     opt.step();
//     opt.zero_grad();
//     return std::vector<Tensor>{loss};
//   });
//   for (...) { opt.set_lr(schedule.at(i)); Tensor loss = step({ids, targets})[0]; }
//
// The first call traces the function (compile/trace/trace.h: that call runs eagerly and its results are returned)
// into ONE graph holding forward, backward, the optimizer update and the gradient bookkeeping; passes
// (compile/pipeline.h) optimize it and later calls run the compiled executable. Parameters and optimizer state
// are read by handle and updated in place; the learning rate and step count are re-read on every call, so an
// LR schedule never recompiles. The callable must not outlive the model and optimizer it closes over.
//
// Guards: each compiled entry is keyed by the signature of the args (dtype, device, shape with dynamic dims
// symbolic, requires_grad), of the captured tensors and by the options. A mismatch recompiles (counted, with
// the reason); past recompile_limit the function runs eagerly with one warning naming the changing input, or
// throws under error_on_recompile. Dynamic dims: dynamic=true makes every arg dim dynamic, dynamic=auto makes
// a dim dynamic after it changed once (one recompile), mark_dynamic(t, dim, min, max) before the call marks
// one. Note [Dynamic dims re-specialize]: shape attributes of view ops (reshape to {B*T, C}) are concrete in
// the graph, so a new size of a dynamic dim re-traces the function (one eager step) into a specialization
// that is not counted as a recompile; its kernels (sized constants) are generated once per shape and cached
// by structure, so repeated sizes cost nothing after the first time.
//
// Graph breaks (item() on a traced value, data-dependent branches, ops with no lowering): with fullgraph
// they throw naming the user's source line and reason; otherwise the graph is split there and the function
// continues: later calls run it with its ops deferred, each piece between two breaks compiled once and run
// as one graph (compile/trace/segments.h), the op with no lowering eagerly. Breaks and segments are reported
// (explain(), INGOT_LOGS=graph_breaks).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tensor.h"

namespace ingot {

// On GPUs: ReduceOverhead replays the step as CUDA graphs (compile/exec/graph_replay.h); MaxAutotune times kernel
// launch configs and cuBLASLt algorithms (compile/autotune/) and, as torch.compile's max-autotune does, also
// replays CUDA graphs; MaxAutotuneNoCudagraphs only tunes. On CPUs all of them behave as Default.
enum class CompileMode { Default, ReduceOverhead, MaxAutotune, MaxAutotuneNoCudagraphs };
// torch.compile's spelling: "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"; nullopt
// for anything else.
std::optional<CompileMode> parse_compile_mode(std::string_view name);
inline bool autotunes(CompileMode m) {
  return m == CompileMode::MaxAutotune || m == CompileMode::MaxAutotuneNoCudagraphs;
}
inline bool replays_cuda_graphs(CompileMode m) {
  return m == CompileMode::ReduceOverhead || m == CompileMode::MaxAutotune;
}
enum class DynamicMode { Auto, True, False };
enum class CompileBackend { Eager, Cpu, Cuda, Auto };  // Eager: trace and run node by node, no codegen
enum class Stance { Default, ForceEager, EagerOnRecompile, FailOnRecompile, EagerThenCompile };

struct CompileOptions {
  CompileMode mode = CompileMode::Default;
  bool fullgraph = false;
  DynamicMode dynamic = DynamicMode::Auto;
  int recompile_limit = 8;
  bool error_on_recompile = false;
  bool regional = false;  // repeated blocks share kernels by structural hash in every mode
  CompileBackend backend = CompileBackend::Auto;
  std::string cache_dir;       // empty: $INGOT_CACHE_DIR or ~/.cache/ingot
  double memory_budget = 1.0;  // fraction of saved activations kept; the rest is recomputed in backward (values
                               // free to remake are remade at any budget: Note [Saved values remade for free])
  // Each parameter's optimizer update right after its gradient is complete (compile/passes/split_update.cpp):
  // gradients die early (lower peak), at the cost of one update launch per parameter instead of one in all.
  bool split_update = false;
  // Data parallel: one optimizer update per gradient bucket, each waiting only for its bucket's reduction
  // (compile/passes/bucket_updates.cpp), instead of one update after all of them; under CUDA graphs too when the
  // updates are generated CUDA kernels (they read their learning rate from device memory inside the graph, Note
  // [Scalars read from the device], compile/exec/graph_replay.h). A graph without collectives is unchanged. On by
  // default: the updates of the first buckets run while the last ones reduce, so no wait is exposed (GPT-2 124M
  // DDP x4 on H200: 33.03 -> 32.56 ms, exposed 0.81 -> 0.00 ms, bench/RESULTS.md 2026-11-26); exact against eager
  // DDP on CPUs and on 2 GPUs (tests/gpu/test_ddp_multi_gpu.cpp).
  bool bucket_updates = true;
  // Compiled ZeRO-3: a unit's gradient reduce-scatter is waited for, and its whole flattened input released, once
  // the reduce-scatter this many units later is issued (compile/passes/unit_reductions.h), so at most lag + 1
  // units' inputs are alive at once; 0 waits for all of them at the end of the backward, where the trace put them.
  int unit_reduction_lag = 1;
  bool disable = false;        // run eagerly, never trace
  Stance stance = Stance::Default;
  std::string name = "step";   // for logs and explain
  // max-autotune on CUDA: wall-clock seconds one compile may spend timing candidates (kernel launch configs,
  // then cuBLASLt algorithms on the first runs); once spent, what is left keeps the heuristic choice.
  // Winners are stored in the autotune database (compile/autotune/autotune_db.h) under cache_dir.
  double autotune_budget_s = 60;
  uint64_t hash() const;       // the options part of a cache key
};

// Marks dim `dim` of `t` dynamic for the next call that receives `t` (optionally bounded, inclusive).
void mark_dynamic(const Tensor& t, int64_t dim, std::optional<int64_t> min = std::nullopt,
                  std::optional<int64_t> max = std::nullopt);

// Compile time by phase, in milliseconds.
struct PhaseTimes {
  double trace_ms = 0, passes_ms = 0, lower_ms = 0, codegen_ms = 0, total_ms = 0;
};

// What max-autotune did (CUDA only; all zero in other modes and on the CPU). A choice "from the db" was
// read from the autotune database (or this process's copy of it): nothing was timed for it.
struct AutotuneStats {
  int64_t kernels_timed = 0, kernels_from_db = 0;
  int64_t kernels_untuned = 0;  // heuristic launch config: budget spent, or nothing to choose (multi-tensor)
  int64_t matmuls_timed = 0, matmuls_from_db = 0;  // distinct cuBLASLt signatures, counted on the first runs
  int64_t matmuls_untuned = 0;                     // first heuristic: budget spent, or nothing to time
  double seconds = 0;                              // spent timing candidates
};

struct CompileStats {
  int64_t calls = 0, compiled_calls = 0, eager_calls = 0;
  int64_t compiles = 0;         // traces that produced an entry (first compile included)
  int64_t recompiles = 0;       // guard failures that compiled again (first compile excluded)
  int64_t specializations = 0;  // new sizes of dynamic dims (Note [Dynamic dims re-specialize])
  std::vector<std::string> recompile_reasons;
  std::vector<std::string> graph_breaks;  // "file:line: reason"
  int64_t graphs = 0;             // graphs one call runs: 1 for a whole step, the segments of the last call
                                  // of a function with graph breaks
  int64_t segments_compiled = 0;  // distinct segment graphs compiled (functions with graph breaks)
  std::vector<std::string> segments;  // one line per segment of the last call (functions with graph breaks)
  int64_t ops_before = 0, ops_after = 0, fused_groups = 0;
  int64_t kernels = 0;            // fused groups running as one generated kernel in the last graph
  int64_t launches = 0;           // executor steps of the last graph that run code: kernels plus ops run one by
                                  // one (views excluded: they only re-describe a buffer)
  int64_t compute_ops = 0;        // traced ops that are not views (what eager launches)
  int64_t kernels_generated = 0;  // compiled by the C++ compiler (all compiles of this function)
  int64_t kernels_reused = 0;     // found already compiled (this process, or the disk cache)
  int64_t kernels_disk_hits = 0;
  int64_t planned_peak_bytes = 0, unplanned_peak_bytes = 0;  // memory plan of the last compiled graph
  // remat (compile/passes/remat.h: memory_budget < 1, and values free to remake), the last compiled graph: the bytes of forward values its
  // backward reads, and how many of them are recomputed there instead of kept.
  int64_t saved_for_backward_bytes = 0, recomputed_bytes = 0;
  PhaseTimes time;
  AutotuneStats autotune;  // all compiles of this function
  // reduce-overhead on a GPU (compile/exec/graph_replay.h): CUDA graphs replayed per call and the steps run normally
  // between them (they read host values); the reason when the step cannot be captured and runs without graphs.
  int64_t cuda_graphs = 0, cuda_graph_host_steps = 0;
  std::string cuda_graph_fallback;
  std::string last_graph;  // printed graph after passes
  // Data parallel: the collectives of the last graph in issue order, one line each (what it moves: a gradient
  // bucket, an FSDP unit's weights or gradients; where it is waited for; the compute it overlaps), explain's
  // "collectives" section (compile/explain.h: describe_collectives).
  std::vector<std::string> collectives;
};

// Whether the logs, explain and the trainer's compile line report remat's recomputation: under a memory budget
// (< 1), or at any budget when something was remade for free (Note [Saved values remade for free], remat.cpp).
inline bool recomputation_to_report(double memory_budget, int64_t recomputed_bytes) {
  return memory_budget < 1.0 || recomputed_bytes > 0;
}

class CompiledFunction {
 public:
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  std::vector<Tensor> operator()(const std::vector<Tensor>& args);
  void set_stance(Stance s);  // takes effect on the next call, no re-wrapping
  const CompileStats& stats() const;
  const CompileOptions& options() const;
  struct State;

 private:
  friend CompiledFunction compile(Fn fn, CompileOptions opts);
  std::shared_ptr<State> state_;
};

CompiledFunction compile(CompiledFunction::Fn fn, CompileOptions opts = {});

}  // namespace ingot
