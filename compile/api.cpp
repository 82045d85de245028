#include "compile/api.h"

#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

#include "compile/exec/graph_replay.h"
#include "compile/logs.h"
#include "compile/pipeline.h"
#include "compile/trace/segments.h"
#include "compile/trace/trace.h"
#include "runtime/sha256.h"

namespace ingot {
namespace {

struct DynRange {
  int64_t min = 2, max = INT64_MAX;
};

// mark_dynamic registry: by TensorImpl, validated by a weak pointer so a reused address is not matched.
std::mutex g_mark_mu;
std::map<const TensorImpl*, std::pair<std::weak_ptr<TensorImpl>, std::map<int64_t, DynRange>>> g_marks;

std::map<int64_t, DynRange> take_marks(const Tensor& t) {
  std::lock_guard<std::mutex> lock(g_mark_mu);
  auto it = g_marks.find(t.impl());
  if (it == g_marks.end()) return {};
  std::map<int64_t, DynRange> r;
  if (!it->second.first.expired()) r = it->second.second;
  g_marks.erase(it);
  return r;
}

struct ArgSig {
  DType dtype;
  Device device;
  Shape shape;
  bool requires_grad;
};

std::vector<ArgSig> signature_of(const std::vector<Tensor>& args) {
  std::vector<ArgSig> s;
  for (size_t i = 0; i < args.size(); ++i) {
    INGOT_CHECK(args[i].defined(), "[compile] argument ", i, " is an undefined tensor");
    s.push_back(ArgSig{args[i].dtype(), args[i].device(), args[i].shape(), args[i].requires_grad()});
  }
  return s;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

uint64_t CompileOptions::hash() const {
  // Only what changes the compiled artifact: not disable/stance/limits (they decide whether to compile).
  Key64 k;
  k.add(static_cast<uint64_t>(mode)).add(fullgraph).add(static_cast<uint64_t>(dynamic)).add(regional);
  k.add(static_cast<uint64_t>(backend)).add(static_cast<uint64_t>(memory_budget * 1e6)).add(split_update);
  k.add(bucket_updates).add(static_cast<uint64_t>(unit_reduction_lag));
  // Passes left out for a diagnosis (compile/pipeline.cpp) make another artifact.
  const char* skipped = std::getenv("INGOT_SKIP_PASSES");
  k.add(std::string_view(skipped ? skipped : ""));
  return k.value();
}

void mark_dynamic(const Tensor& t, int64_t dim, std::optional<int64_t> min, std::optional<int64_t> max) {
  INGOT_CHECK(t.defined(), "mark_dynamic: undefined tensor");
  const int64_t d = wrap_dim(dim, t.dim(), "mark_dynamic");
  DynRange r;
  if (min) r.min = *min;
  if (max) r.max = *max;
  INGOT_CHECK(r.min <= r.max, "mark_dynamic: min ", r.min, " > max ", r.max);
  INGOT_CHECK(t.size(d) >= r.min && t.size(d) <= r.max, "mark_dynamic: dim ", d, " has size ", t.size(d),
              ", outside the given range [", r.min, ", ", r.max, "]");
  std::lock_guard<std::mutex> lock(g_mark_mu);
  auto& slot = g_marks[t.impl()];
  if (slot.first.lock().get() != t.impl()) slot = {t.impl_ptr(), {}};
  slot.second[d] = r;
}

struct CompiledFunction::State {
  Fn fn;
  CompileOptions opts;
  CompileStats stats;
  struct Entry {
    std::vector<ArgSig> sig;
    std::shared_ptr<compiler::Executable> exe;  // null: the function has graph breaks
    std::shared_ptr<compiler::GraphReplay> replay;  // reduce-overhead on a GPU: the step as CUDA graphs
    std::string defer_blocker;  // with graph breaks: why calls cannot run split into segments (then eager)
  };
  std::vector<Entry> entries;
  compiler::SegmentCache segments;  // the compiled segments of functions with graph breaks
  std::vector<std::map<int64_t, DynRange>> dynamic;  // per arg position
  bool warned_limit = false, warmed = false;

  bool is_dynamic(size_t arg, size_t dim, int64_t size) const {
    if (opts.dynamic == DynamicMode::False) return false;
    if (opts.dynamic == DynamicMode::True) return true;
    if (arg >= dynamic.size()) return false;
    auto it = dynamic[arg].find(static_cast<int64_t>(dim));
    return it != dynamic[arg].end() && size >= it->second.min && size <= it->second.max;
  }

  // Captured tensors must still look as traced (a parameter replaced or re-typed recompiles).
  static std::string captured_mismatch(const compiler::Graph& g) {
    for (const compiler::GraphInput& in : g.inputs) {
      if (in.role != compiler::InputRole::Captured || in.jit >= 0) continue;  // jit: checked when bound
      Tensor t = in.grad_of ? Tensor(in.grad_of->grad) : in.tensor;
      const compiler::Value& v = g.values[static_cast<size_t>(in.value)];
      if (!t.defined()) return "captured '" + in.name + "' is undefined now";
      if (t.dtype() != v.dtype || t.shape() != compiler::trace_shape(v.shape) || !(t.device() == v.device))
        return "captured '" + in.name + "' changed from " + value_meta_str(g, v.id) + " to " +
               std::string(dtype_name(t.dtype())) + shape_str(t.shape());
    }
    return {};
  }

  // "" when `sig` matches entry `e`; else the first difference in words (a non-dynamic one when there is one).
  std::string diff(const Entry& e, const std::vector<ArgSig>& sig, bool allow_dynamic, bool* only_dynamic) const {
    std::vector<std::pair<std::string, bool>> found;  // (what, dynamic)
    if (e.sig.size() != sig.size())
      found.emplace_back(detail::str_cat("number of args changed from ", e.sig.size()) + " to " +
                             std::to_string(sig.size()), false);
    for (size_t i = 0; i < sig.size() && e.sig.size() == sig.size(); ++i) {
      const ArgSig &a = e.sig[i], &b = sig[i];
      const std::string name = detail::str_cat("arg", i);
      if (a.dtype != b.dtype)
        found.emplace_back(name + " dtype changed from " + std::string(dtype_name(a.dtype)) + " to " +
                               std::string(dtype_name(b.dtype)), false);
      if (!(a.device == b.device))
        found.emplace_back(name + " device changed from " + a.device.str() + " to " + b.device.str(), false);
      if (a.requires_grad != b.requires_grad)
        found.emplace_back(name + " requires_grad changed to " + (b.requires_grad ? "true" : "false"), false);
      if (a.shape.size() != b.shape.size()) {
        found.emplace_back(name + " rank changed from " + shape_str(a.shape) + " to " + shape_str(b.shape), false);
        continue;
      }
      for (size_t d = 0; d < a.shape.size(); ++d)
        if (a.shape[d] != b.shape[d]) {
          const bool dyn = allow_dynamic && is_dynamic(i, d, b.shape[d]);
          found.emplace_back(name + detail::str_cat(" dim ", d) + detail::str_cat(" changed from ", a.shape[d]) +
                                 detail::str_cat(" to ", b.shape[d]) + (dyn ? " (dynamic)" : ""),
                             dyn);
        }
    }
    if (found.empty() && e.exe) {
      std::string c = captured_mismatch(e.exe->graph);
      if (!c.empty()) found.emplace_back(c, false);
    }
    *only_dynamic = !found.empty();
    for (const auto& f : found) *only_dynamic = *only_dynamic && f.second;
    for (const auto& f : found)
      if (!f.second) return f.first;
    return found.empty() ? std::string() : found.front().first;
  }

  // Dims compiled dynamic become named symbols on the arg inputs (printing, explain, kernel size slots).
  void mark_symbolic(compiler::Graph& g) const {
    for (const compiler::GraphInput& in : g.inputs) {
      if (in.role != compiler::InputRole::Arg) continue;
      compiler::Value& v = g.values[static_cast<size_t>(in.value)];
      for (size_t d = 0; d < v.shape.size(); ++d) {
        const size_t arg = static_cast<size_t>(in.arg);
        if (!is_dynamic(arg, d, v.shape[d].value)) continue;
        compiler::Symbol sym{detail::str_cat("s", g.symbols.size())};
        if (arg < dynamic.size())
          if (auto it = dynamic[arg].find(static_cast<int64_t>(d)); it != dynamic[arg].end()) {
            sym.min = it->second.min;
            sym.max = it->second.max;
          }
        v.shape[d].sym = static_cast<int32_t>(g.symbols.size());
        g.symbols.push_back(sym);
      }
    }
  }

  static bool on_gpu(const compiler::Graph& g) {
    const std::optional<Device> d = compiler::compute_device(g);
    return !d || d->is_cuda();  // nullopt: values on two GPUs
  }

  std::vector<Tensor> run_replay(compiler::GraphReplay& r, const std::vector<Tensor>& args) {
    std::vector<Tensor> outs = r.run(args);
    stats.cuda_graphs = static_cast<int64_t>(r.graphs());
    stats.cuda_graph_host_steps = static_cast<int64_t>(r.host_steps());
    stats.cuda_graph_fallback = r.disabled_reason();
    return outs;
  }

  std::vector<Tensor> run_eager(const std::vector<Tensor>& args) {
    ++stats.eager_calls;
    return fn(args);
  }

  std::vector<Tensor> run_with_breaks(const Entry& e, const std::vector<Tensor>& args) {
    if (!e.defer_blocker.empty()) {
      if (segments.warned.insert("blocker").second)
        compiler::log(compiler::LogKind::GraphBreaks, "warning: '" + opts.name + "' has graph breaks and cannot run " +
                                                          "split into compiled segments (" + e.defer_blocker +
                                                          "); it runs eagerly");
      return run_eager(args);
    }
    ++stats.compiled_calls;
    return compiler::run_segmented(fn, args, segments, opts, stats);
  }

  std::vector<Tensor> compile_and_run(const std::vector<Tensor>& args, const std::vector<ArgSig>& sig) {
    const auto t0 = std::chrono::steady_clock::now();
    if (log_on(compiler::LogKind::Progress)) compiler::log(compiler::LogKind::Progress, "compiling '" + opts.name + "': tracing");
    compiler::TraceResult tr = compiler::trace(fn, args, opts.fullgraph);
    stats.time.trace_ms += ms_since(t0);
    ++stats.compiles;
    Entry e;
    e.sig = sig;
    if (!tr.breaks.empty()) {
      // Later calls run split at the breaks (compile/trace/segments.h); this call already ran eagerly.
      for (const compiler::GraphBreak& b : tr.breaks) {
        bool seen = false;
        for (const std::string& s : stats.graph_breaks) seen = seen || s == b.str();
        if (seen) continue;
        stats.graph_breaks.push_back(b.str());
        if (compiler::log_on(compiler::LogKind::GraphBreaks)) compiler::log(compiler::LogKind::GraphBreaks, b.str());
      }
      stats.graphs = static_cast<int64_t>(tr.breaks.size()) + 1;
      e.defer_blocker = tr.defer_blocker;
      entries.push_back(std::move(e));
      stats.time.total_ms += ms_since(t0);
      return tr.outputs;
    }
    mark_symbolic(tr.graph);
    if (compiler::log_on(compiler::LogKind::Graph)) compiler::log(compiler::LogKind::Graph, tr.graph.str());
    if (compiler::log_on(compiler::LogKind::Progress))
      compiler::log(compiler::LogKind::Progress, "compiling '" + opts.name + "': passes over " +
                                                   std::to_string(tr.graph.nodes.size()) + " ops");
    e.exe = compiler::build_executable(std::move(tr.graph), opts, stats);
    if (replays_cuda_graphs(opts.mode)) {
      // On CPUs reduce-overhead is default; on a GPU a step that cannot be captured says why, once.
      const std::string why = compiler::GraphReplay::unsupported_reason(*e.exe);
      if (why.empty()) {
        e.replay = std::make_shared<compiler::GraphReplay>(e.exe);
      } else if (on_gpu(e.exe->graph)) {
        stats.cuda_graph_fallback = why;
        compiler::log(compiler::LogKind::Recompiles, "warning: reduce-overhead: '" + opts.name +
                                                         "' runs without CUDA graphs: " + why);
      }
    }
    stats.graphs = 1;
    stats.last_graph = e.exe->graph.str();
    entries.push_back(std::move(e));
    stats.time.total_ms += ms_since(t0);
    if (compiler::log_on(compiler::LogKind::Perf)) {
      std::ostringstream os;
      os << "compile '" << opts.name << "': trace " << stats.time.trace_ms << " ms, passes " << stats.time.passes_ms
         << " ms, lower " << stats.time.lower_ms << " ms, codegen " << stats.time.codegen_ms << " ms";
      compiler::log(compiler::LogKind::Perf, os.str());
    }
    return tr.outputs;
  }

  std::vector<Tensor> call(const std::vector<Tensor>& args) {
    ++stats.calls;
    if (opts.disable || opts.stance == Stance::ForceEager) return run_eager(args);
    if (dynamic.size() < args.size()) dynamic.resize(args.size());
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].defined())
        for (auto& [d, r] : take_marks(args[i])) dynamic[i][d] = r;
    const std::vector<ArgSig> sig = signature_of(args);
    for (const Entry& e : entries) {
      bool only_dyn = false;
      if (!diff(e, sig, false, &only_dyn).empty()) continue;
      if (compiler::log_on(compiler::LogKind::Guards)) compiler::log(compiler::LogKind::Guards, "'" + opts.name + "': guards pass");
      if (!e.exe) return run_with_breaks(e, args);
      ++stats.compiled_calls;
      if (e.replay) return run_replay(*e.replay, args);
      return compiler::execute(*e.exe, args);
    }
    if (entries.empty()) {
      if (opts.stance == Stance::EagerThenCompile && !warmed) {
        warmed = true;
        return run_eager(args);
      }
      return compile_and_run(args, sig);
    }
    // A guard failed against every entry: compare with the most recent one for the reason.
    bool only_dyn = false;
    const std::string reason = diff(entries.back(), sig, true, &only_dyn);
    if (only_dyn) {
      ++stats.specializations;
      if (compiler::log_on(compiler::LogKind::Recompiles))
        compiler::log(compiler::LogKind::Recompiles, "'" + opts.name + "': new size of a dynamic dim, re-specializing: " + reason);
      return compile_and_run(args, sig);
    }
    const std::string msg = "recompile of '" + opts.name + "': " + reason;
    if (compiler::log_on(compiler::LogKind::Recompiles)) compiler::log(compiler::LogKind::Recompiles, msg);
    INGOT_CHECK(!opts.error_on_recompile && opts.stance != Stance::FailOnRecompile, "[compile] ", msg,
                opts.error_on_recompile ? " (error_on_recompile is set)" : " (stance fail_on_recompile)");
    if (opts.stance == Stance::EagerOnRecompile) return run_eager(args);
    if (stats.recompiles >= opts.recompile_limit) {
      if (!warned_limit) {
        warned_limit = true;
        compiler::log(compiler::LogKind::Recompiles, "warning: '" + opts.name + "' reached recompile_limit (" +
                                                       std::to_string(opts.recompile_limit) +
                                                       "); running eagerly from now on. Last change: " + reason);
      }
      return run_eager(args);
    }
    ++stats.recompiles;
    stats.recompile_reasons.push_back(reason);
    if (opts.dynamic == DynamicMode::Auto) {
      // Automatic dynamic: a dim that changed is compiled symbolic from now on.
      const std::vector<ArgSig>& prev = entries.back().sig;
      for (size_t i = 0; i < sig.size() && prev.size() == sig.size(); ++i) {
        if (prev[i].shape.size() != sig[i].shape.size()) continue;
        for (size_t d = 0; d < sig[i].shape.size(); ++d)
          if (prev[i].shape[d] != sig[i].shape[d]) dynamic[i].emplace(static_cast<int64_t>(d), DynRange{});
      }
    }
    return compile_and_run(args, sig);
  }
};

std::vector<Tensor> CompiledFunction::operator()(const std::vector<Tensor>& args) { return state_->call(args); }
void CompiledFunction::set_stance(Stance s) { state_->opts.stance = s; }
const CompileStats& CompiledFunction::stats() const { return state_->stats; }
const CompileOptions& CompiledFunction::options() const { return state_->opts; }

std::optional<CompileMode> parse_compile_mode(std::string_view name) {
  if (name == "default") return CompileMode::Default;
  if (name == "reduce-overhead") return CompileMode::ReduceOverhead;
  if (name == "max-autotune") return CompileMode::MaxAutotune;
  if (name == "max-autotune-no-cudagraphs") return CompileMode::MaxAutotuneNoCudagraphs;
  return std::nullopt;
}

CompiledFunction compile(CompiledFunction::Fn fn, CompileOptions opts) {
  INGOT_CHECK(fn != nullptr, "compile: the function is empty");
  INGOT_CHECK(opts.recompile_limit >= 0, "compile: recompile_limit must be >= 0, got ", opts.recompile_limit);
  INGOT_CHECK(opts.memory_budget > 0 && opts.memory_budget <= 1, "compile: memory_budget must be in (0, 1], got ",
              opts.memory_budget);
  CompiledFunction f;
  f.state_ = std::make_shared<CompiledFunction::State>();
  f.state_->fn = std::move(fn);
  f.state_->opts = std::move(opts);
  return f;
}

}  // namespace ingot
