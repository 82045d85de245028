#include "compile/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "compile/codegen/cpu/cpu_codegen.h"
#include "compile/codegen/cpu/render_cpp.h"
#ifdef INGOT_WITH_CUDA_CODEGEN
#include "compile/autotune/cuda/tuner.h"
#include "compile/codegen/cuda/cuda_codegen.h"
#include "compile/codegen/cuda/render_cuda.h"
#include "runtime/cuda_runtime.h"
#endif
#include "compile/exec/kernel_step.h"
#include "compile/explain.h"
#include "compile/logs.h"
#include "compile/lower/lower_kernel.h"
#include "compile/passes/passes.h"
#include "compile/passes/unit_gathers.h"
#include "compile/passes/unit_reductions.h"

namespace ingot::autotune {
class CudaSession;  // max-autotune on CUDA (compile/autotune/cuda/tuner.h)
}

namespace ingot::compiler {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// INGOT_SKIP_PASSES=name,name: passes left out, to bisect a miscompilation (the names INGOT_LOGS=passes prints).
// Only optimizations should be skipped; a pass the backend needs (functionalize) fails later when skipped.
bool skipped_by_env(std::string_view name) {
  // Built with append, not a + chain: GCC 12 warns (-Wrestrict, a false positive) on "," + string + ",".
  static const std::string skipped = [] {
    const char* e = std::getenv("INGOT_SKIP_PASSES");
    std::string list(",");
    list.append(e ? e : "").append(",");
    return list;
  }();
  std::string key(",");
  key.append(name).append(",");
  return skipped.find(key) != std::string::npos;
}

template <class F>
void run_pass(const char* name, Graph& g, F&& pass) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t before = g.nodes.size();
  const bool changed = !skipped_by_env(name) && pass(g);
#ifndef NDEBUG
  g.verify();
#endif
  if (log_on(LogKind::Passes)) {
    std::ostringstream os;
    os << name << ": " << (changed ? "changed" : "no change") << ", ops " << before << " -> " << g.nodes.size()
       << " (" << ms_since(t0) << " ms)";
    log(LogKind::Passes, os.str());
    if (changed) log(LogKind::Passes, g.str());
  }
}

// One code generator per cache directory and backend, shared by every graph of the process (kernels dedup
// across graphs); the default directory uses the backend's process-wide instance.
template <class Codegen, class Options>
Codegen& codegen_for(const std::string& dir) {
  if (dir.empty()) return Codegen::shared();
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Codegen>> by_dir;
  std::lock_guard<std::mutex> lock(mu);
  auto& cg = by_dir[dir];
  if (!cg) {
    Options o;
    o.cache_dir = dir;
    cg = std::make_unique<Codegen>(o);
  }
  return *cg;
}

// A group lowers for `dev` when every buffer it touches lives there; the MultiTensor update's hyper row is
// read on the host by the step glue and is exempt.
bool buffers_on(const Graph& g, const LoweredGroup& lg, Device dev) {
  auto on = [&](int32_t v) { return v == lg.hyper_value || g.values[static_cast<size_t>(v)].device == dev; };
  for (int32_t v : lg.inputs)
    if (!on(v)) return false;
  for (int32_t v : lg.outputs)
    if (!on(v)) return false;
  return true;
}

// Lowers every fusion group it can and compiles the kernels in one batch for `dev` (the CPU's C++ codegen or
// the CUDA codegen); returns the executor steps' kernels.
std::map<int32_t, GroupKernel> generate_kernels(const Graph& g, Device dev, const CompileOptions& opts,
                                                CompileStats& stats, [[maybe_unused]] autotune::CudaSession* tuning) {
  std::map<int32_t, GroupKernel> fns;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<LoweredGroup> lowered;
  std::vector<int32_t> ids;
  for (const FusionGroup& fg : g.groups) {
    std::string why;
    std::optional<LoweredGroup> lg = lower_group(g, fg, &why);
    if (lg && !buffers_on(g, *lg, dev)) {
      why = "its buffers are not all on " + dev.str();
      lg.reset();
    }
    if (lg) {
      lowered.push_back(std::move(*lg));
      ids.push_back(fg.id);
    } else if (log_on(LogKind::OutputCode)) {
      log(LogKind::OutputCode, fg.name + ": not lowered (" + why + "); its ops run one by one");
    }
  }
  stats.time.lower_ms += ms_since(t0);
  if (lowered.empty()) return fns;
  std::vector<codegen::KernelSpec> specs;
  for (const LoweredGroup& lg : lowered) specs.push_back(lg.spec);
  codegen::CodegenStats cs;
  std::function<void(int64_t, int64_t)> progress;
  if (log_on(LogKind::Progress))
    progress = [&opts](int64_t done, int64_t total) {
      log(LogKind::Progress, "compiling '" + opts.name + detail::str_cat("': codegen, kernels ", done, "/", total));
    };
  std::vector<KernelCall> kernels;
  std::vector<DeviceScalarsCall> device_calls;  // CUDA multi-tensor kernels: the launch reading device scalars
  std::vector<std::string> sources;  // INGOT_LOGS=output_code only
  const bool show_code = log_on(LogKind::OutputCode);
  if (dev.is_cpu()) {
    auto& cg = codegen_for<codegen::cpu::CpuCodegen, codegen::cpu::CpuCodegenOptions>(opts.cache_dir);
    for (codegen::cpu::CpuKernel& k : cg.compile(specs, &cs, progress)) {
      if (show_code) sources.push_back(codegen::cpu::render_kernel(specs[kernels.size()], k.symbol));
      kernels.emplace_back(std::move(k));
    }
  } else {
#ifdef INGOT_WITH_CUDA_CODEGEN
    // CudaCodegen compiles for and loads into the current device.
    const int previous = ingot::cuda::current_device();
    ingot::cuda::set_device(dev.index);
    auto& cg = codegen_for<codegen::cuda::CudaCodegen, codegen::cuda::CudaCodegenOptions>(opts.cache_dir);
    std::vector<codegen::cuda::CudaKernel> compiled;
    try {
      compiled = cg.compile(specs, &cs, progress);
      if (tuning) tuning->tune_kernels(specs, compiled);
    } catch (...) {
      ingot::cuda::set_device(previous);
      throw;
    }
    ingot::cuda::set_device(previous);
    for (codegen::cuda::CudaKernel& k : compiled) {
      if (show_code) sources.push_back(codegen::cuda::render_kernel(specs[kernels.size()], k.symbol).source);
      device_calls.emplace_back();
      if (k.abi.kind == codegen::KernelKind::MultiTensor)
        device_calls.back() = [k](void* const* bufs, const int64_t* syms, const double* device_scalars) {
          k.launch_reading_device_scalars(bufs, syms, device_scalars);
        };
      kernels.emplace_back(std::move(k));
    }
#else
    return fns;
#endif
  }
  if (log_on(LogKind::Progress))
    log(LogKind::Progress, "compiling '" + opts.name + detail::str_cat("': kernels ", specs.size()) + "/" +
                               std::to_string(specs.size()) + " (" + cs.summary() + ")");
  for (const std::string& src : sources) log(LogKind::OutputCode, src);
  stats.time.codegen_ms += cs.total_s() * 1000.0;
  stats.kernels_generated += cs.compiled;
  stats.kernels_reused += cs.memory_hits + cs.disk_hits;
  stats.kernels_disk_hits += cs.disk_hits;
  device_calls.resize(kernels.size());  // the CPU's kernels: none
  for (size_t i = 0; i < lowered.size(); ++i)
    fns[ids[i]] = make_kernel_step(g, lowered[i], kernels[i], device_calls[i]);
  return fns;
}

}  // namespace

std::shared_ptr<Executable> build_executable(Graph g, const CompileOptions& opts, CompileStats& stats) {
  const auto t0 = std::chrono::steady_clock::now();
  stats.ops_before = static_cast<int64_t>(g.nodes.size());
  stats.compute_ops = 0;
  for (const Node& n : g.nodes) stats.compute_ops += n.prim->fusion_kind() != FusionKind::View;
  // Every pass is told the device it optimizes for; the rewrites that pay off only when groups become generated
  // kernels, or that fuse ops into library calls, are left out when every op runs its eager kernel.
  const Device target = passes::pass_target(g);
  const bool generated = opts.backend != CompileBackend::Eager;
  run_pass("dce", g, [&](Graph& x) { return passes::dce(x, {target}); });
  run_pass("functionalize", g, [&](Graph& x) { return passes::functionalize(x, {target}); });
  run_pass("simplify", g, [&](Graph& x) { return passes::simplify(x, {target}); });
  run_pass("cse", g, [&](Graph& x) { return passes::cse(x, {target}); });
  run_pass("dce", g, [&](Graph& x) { return passes::dce(x, {target}); });
  // The split pays off only when its halves become generated kernels; node by node it would run the norm
  // backward's eager kernel twice.
  run_pass("decompose_norm_bwd", g, [&](Graph& x) { return generated && passes::decompose_norm_bwd(x, {target}); });
  // Before the epilogues: a widening cast moved onto a gradient's product widens the product there.
  run_pass("cast_pieces", g, [&](Graph& x) { return passes::cast_pieces(x, {target}); });
  run_pass("matmul_epilogues", g, [&](Graph& x) {
    return generated && passes::fuse_matmul_epilogues(x, {.target = target, .with_dbias = true});
  });
  run_pass("fuse_cross_entropy", g, [&](Graph& x) { return generated && passes::fuse_cross_entropy(x, {target}); });
  run_pass("pack_attention_grads", g, [&](Graph& x) { return generated && passes::pack_attention_grads(x, {target}); });
  run_pass("accumulate_index_add", g, [&](Graph& x) { return generated && passes::accumulate_index_add(x, {target}); });
  // After matmul_epilogues, whose fused products (matmul_dgelu, widened casts) carry no alpha and whose matches
  // would otherwise see the accumulating and scaled products: Note [Products accumulated in place], Note [Scales
  // folded into products].
  run_pass("accumulate_products", g, [&](Graph& x) { return generated && passes::accumulate_products(x, {target}); });
  run_pass("scale_into_products", g, [&](Graph& x) { return generated && passes::scale_into_products(x, {target}); });
  run_pass("dce", g, [&](Graph& x) { return passes::dce(x, {target}); });
  run_pass("remat", g, [&](Graph& x) {
    int64_t recomputed = 0, saved = 0;
    const bool changed = passes::remat(x, {target, opts.memory_budget, generated}, &recomputed, &saved);
    stats.saved_for_backward_bytes = saved;
    stats.recomputed_bytes = recomputed;
    if (recomputation_to_report(opts.memory_budget, recomputed) && log_on(LogKind::Passes))
      log(LogKind::Passes, detail::str_cat("remat: budget ", opts.memory_budget, ": recomputes ", recomputed,
                                           " of the ", saved, " bytes saved for the backward"));
    return changed;
  });
  // Compiled ZeRO-3: the backward's own unit gathers and the prefetch order (after remat, whose copies read them).
  run_pass("unit_gathers", g, [&](Graph& x) { return passes::unit_gathers(x, {target}); });
  run_pass("unit_reductions", g,
           [&](Graph& x) { return passes::unit_reductions(x, {target, opts.unit_reduction_lag}); });
  run_pass("dce", g, [&](Graph& x) { return passes::dce(x, {target}); });
  run_pass("split_update", g, [&](Graph& x) { return passes::split_update(x, {target, opts.split_update ? 0.0 : 1.0}); });
  // Per-bucket updates under CUDA graphs need every update inside the graph: a generated CUDA update reads its
  // learning rate from device memory there (Note [Scalars read from the device], compile/exec/graph_replay.h).
  // One run between graphs would end a graph with a collective of the next one in flight, so without generated
  // CUDA kernels those modes keep one update after every wait.
#ifdef INGOT_WITH_CUDA_CODEGEN
  const bool updates_in_graphs = generated && target.is_cuda();
#else
  const bool updates_in_graphs = false;
#endif
  bool bucket_updates = false;
  run_pass("split_update_by_bucket", g, [&](Graph& x) {
    return bucket_updates = opts.bucket_updates && (!replays_cuda_graphs(opts.mode) || updates_in_graphs) &&
                            passes::split_update_by_bucket(x, {target});
  });
  // Note [Pieces read by the update]: after the split, so each unit's update reads its own gradient's pieces
  // (INGOT_SKIP_PASSES=pieces_into_update keeps the sum a kernel of its own, for measuring).
  run_pass("pieces_into_update", g, [&](Graph& x) { return generated && passes::pieces_into_update(x, {target}); });
  // Note [Narrow gradients read by the update]: bf16-reduced gradients reach AdamW without a widening copy.
  run_pass("widen_in_update", g, [&](Graph& x) { return passes::widen_in_update(x, {target}); });
  // Data parallel: each gradient made in its bucket's buffer, so no concatenation copies it (before fuse, which
  // must keep the bucket's view alone and the placed producers' values as their groups' outputs).
  run_pass("bucket_views", g, [&](Graph& x) { return passes::bucket_views(x, {target, generated}); });
  run_pass("fuse", g, [&](Graph& x) {
    return passes::fuse(x, {target, !opts.split_update && !bucket_updates && !passes::updates_per_bucket(x)});
  });
  run_pass("schedule", g, [&](Graph& x) { return passes::schedule(x, {target}); });
  g.verify();
  const passes::MemoryPlan plan = passes::memory_plan(g);
  stats.planned_peak_bytes = plan.arena_bytes;
  stats.collectives = describe_collectives(g);
  stats.unplanned_peak_bytes = plan.unplanned_peak;
  stats.ops_after = static_cast<int64_t>(g.nodes.size());
  stats.fused_groups = static_cast<int64_t>(g.groups.size());
  if (log_on(LogKind::Schedule)) {
    std::ostringstream os;
    os << "schedule: " << g.nodes.size() << " ops in " << g.groups.size() << " fusion groups; arena "
       << plan.arena_bytes << " bytes (sum of live buffers at peak: " << plan.unplanned_peak << ")";
    for (const FusionGroup& fg : g.groups)
      os << "\n  " << fg.name << " (" << group_kind_name(fg.kind) << ", " << fg.nodes.size() << " ops, "
         << fg.inputs.size() << " in, " << fg.outputs.size() << " out)";
    log(LogKind::Schedule, os.str());
  }
  stats.time.passes_ms += ms_since(t0);
  auto exe = std::make_shared<Executable>();
  std::map<int32_t, GroupKernel> kernels;
  std::shared_ptr<autotune::CudaSession> tuning;
  if (opts.backend != CompileBackend::Eager)
    // Values on two GPUs run op by op through the eager kernels.
    if (std::optional<Device> dev = compute_device(g)) {
#ifdef INGOT_WITH_CUDA_CODEGEN
      if (autotunes(opts.mode) && dev->is_cuda())
        tuning = autotune::CudaSession::start(opts, dev->index, stats);
#endif
      kernels = generate_kernels(g, *dev, opts, stats, tuning.get());
    }
  exe->kernels = kernels.size();
  stats.kernels = static_cast<int64_t>(kernels.size());
  exe->steps = plan_steps(g, kernels);
#ifdef INGOT_WITH_CUDA_CODEGEN
  if (tuning) tuning->tune_matmuls(g, exe->steps);
#endif
  stats.launches = 0;
  for (const ExecStep& st : exe->steps)
    stats.launches += st.kernel || g.nodes[static_cast<size_t>(st.node)].prim->fusion_kind() != FusionKind::View;
  exe->graph = std::move(g);
  return exe;
}

}  // namespace ingot::compiler
