#include "compile/trace/segments.h"

#include <chrono>
#include <optional>
#include <sstream>

#include "compile/logs.h"
#include "compile/pipeline.h"
#include "compile/trace/tracer.h"
#include "runtime/sha256.h"

namespace ingot::compiler {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Note [Segment cache key]: a segment is reused when its graph has the same structure (ops, attrs, wiring,
// metadata, input roles, outputs, write-backs: Graph::structural_hash) and its inputs have the same layout
// (strides, offset), which is what the compiled kernels were generated for. Tensor values and identities are
// not part of it: the inputs are rebound at every run. The structural hash has the attributes at full
// precision (Note [Exact attributes], autograd/primitive.h): a host value fed into an op (x * m with m from
// item()) must not find a graph made for a nearby m.
uint64_t segment_key(const Graph& g) {
  Key64 k;
  k.add(g.structural_hash()).add(g.values.size()).add(g.inputs.size());
  for (const GraphInput& in : g.inputs) {
    k.add(static_cast<uint64_t>(in.tensor.offset())).add(in.tensor.strides().size());
    for (int64_t s : in.tensor.strides()) k.add(static_cast<uint64_t>(s));
  }
  return k.value();
}

// A deferred output still to be filled: the stand-in's storage (weakly: a stand-in nobody holds is not an
// output) and the view of it the op returned.
struct Pending {
  std::weak_ptr<Storage> storage;
  TensorKey key;
};

void host_read_hook(const Tensor& t, const std::source_location& loc);
bool raw_access_hook(const Tensor* dst, const Tensor* src);

class Segmenter final : public TraceObserver {
 public:
  Segmenter(SegmentCache& cache, const CompileOptions& opts, CompileStats& stats)
      : cache_(cache), opts_(opts), stats_(stats) {
    reset();
  }

  std::optional<std::vector<Tensor>> defer(const std::shared_ptr<Primitive>& p, const std::vector<Tensor>& inputs,
                                           const std::source_location& loc) override {
    if (eager_op_) return std::nullopt;  // inside an op that runs eagerly: what it applies runs eagerly too
    std::optional<std::string> why = break_reason(*p);
    std::vector<Tensor> outs;
    if (!why) {
      // Views alias their input (no data is read), so they run now on the stand-ins and keep eager's aliasing.
      if (p->fusion_kind() == FusionKind::View) {
        in_view_ = true;
        return std::nullopt;
      }
      try {
        outs = alloc_outputs(p->infer(metas_of(inputs)));
      } catch (const std::exception& e) {
        // Its kernel will report the same problem eagerly, at the user's line.
        why = std::string(p->name()) + ": its shape rule throws (" + e.what() + ")";
      }
    }
    if (why) {
      end_segment(*why, loc);
      eager_op_ = p.get();
      return std::nullopt;
    }
    return outs;
  }

  void on_apply(const std::shared_ptr<Primitive>& p, const std::vector<Tensor>& inputs,
                const std::vector<Tensor>& outputs, const std::source_location& loc) override {
    if (eager_op_) {
      if (p.get() == eager_op_) eager_op_ = nullptr;  // ran on real inputs; its outputs are real
      return;
    }
    in_view_ = false;
    tracer_->on_apply(p, inputs, outputs, loc);
    for (const Tensor& t : inputs)
      if (t.defined() && t.storage()) read_.insert(t.storage().get());
    for (const Tensor& o : outputs) {
      if (!o.defined() || !o.storage()) continue;
      computed_.insert(o.storage().get());
      bool alias = false;
      for (const Tensor& t : inputs) alias = alias || (t.defined() && t.storage() == o.storage());
      if (!alias) pending_.push_back(Pending{o.storage(), key_of(o)});  // a view that copied owns a new one
    }
  }

  void on_accumulate_grad(const std::shared_ptr<TensorImpl>& leaf, const Tensor& grad) override {
    if (leaf->grad && leaf->grad->storage) read_.insert(leaf->grad->storage.get());
    tracer_->on_accumulate_grad(leaf, grad);
  }

  void on_assign(const Tensor& dst, const Tensor& src) override {
    tracer_->on_assign(dst, src);
    read_.insert(src.storage().get());
    computed_.insert(dst.storage().get());
  }

  void on_host_input(const Tensor& t, std::function<Tensor()> produce) override {
    tracer_->on_host_input(t, std::move(produce));
  }

  void host_read(const Tensor& t, const std::source_location& loc) {
    if (t.defined() && t.storage() && computed_.count(t.storage().get())) end_segment(kHostReadBreak, loc);
  }

  // See the raw-copy paragraph of compile/trace/segments.h.
  bool raw_access(const Tensor* dst, const Tensor* src) {
    if (in_view_ || eager_op_) return false;
    const bool src_pending = src && src->defined() && src->storage() && computed_.count(src->storage().get());
    const bool dst_known = dst && dst->defined() && dst->storage() &&
                           (computed_.count(dst->storage().get()) || read_.count(dst->storage().get()));
    // A whole persistent tensor (a parameter, optimizer state) overwritten by a value of the same metadata:
    // the segment's write-back. A partial write (a view) runs the segment and copies real data instead.
    if (src_pending && dst && dst->defined() && dst->storage() && !computed_.count(dst->storage().get()) &&
        dst->shape() == src->shape() && dst->dtype() == src->dtype() && dst->device() == src->device() &&
        dst->offset() == 0 && dst->is_contiguous() && dst->nbytes() == dst->storage()->nbytes) {
      on_assign(*dst, *src);
      return true;
    }
    if (src_pending || dst_known) end_segment("a raw copy (copy_/fill_/clone/to()) reads or overwrites deferred data",
                                              std::nullopt);
    return false;
  }

  // Flushes the pending segment; `loc` names the user's line for a graph break (none for the end of the
  // function and raw copies).
  void end_segment(const std::string& reason, std::optional<std::source_location> loc) {
    std::string where = reason;
    if (loc) {
      GraphBreak b{reason, base_name(loc->file_name()), static_cast<int>(loc->line())};
      where = b.str();
      bool seen = false;
      for (const std::string& s : stats_.graph_breaks) seen = seen || s == where;
      if (!seen) {
        stats_.graph_breaks.push_back(where);
        if (log_on(LogKind::GraphBreaks)) log(LogKind::GraphBreaks, where);
      }
    }
    flush(where);
  }

  int64_t segments() const { return static_cast<int64_t>(lines_.size()); }
  const std::vector<std::string>& lines() const { return lines_; }
  const SegmentInfo& totals() const { return totals_; }

 private:
  // The observer and hooks are off while a segment compiles and runs: its kernels are not the user's ops.
  class Paused {
   public:
    Paused() : obs_(trace_observer()) {
      set_trace_observer(nullptr);
      set_host_read_hook(nullptr);
      set_raw_access_hook(nullptr);
    }
    ~Paused() {
      set_trace_observer(obs_);
      set_host_read_hook(&host_read_hook);
      set_raw_access_hook(&raw_access_hook);
    }
    Paused(const Paused&) = delete;
    Paused& operator=(const Paused&) = delete;

   private:
    TraceObserver* obs_;
  };

  void reset() {
    tracer_ = std::make_unique<Tracer>(std::vector<Tensor>{}, false, TraceMode::Defer);
    pending_.clear();
    computed_.clear();
    read_.clear();
  }

  void flush(const std::string& where) {
    if (tracer_->graph().nodes.empty() && !tracer_->has_writes()) {
      reset();
      return;
    }
    Paused paused;
    struct Fill {
      std::shared_ptr<Storage> storage;
      TensorKey key;
    };
    std::vector<Fill> fills;
    std::vector<int32_t> outs;
    for (const Pending& p : pending_) {
      std::shared_ptr<Storage> st = p.storage.lock();
      if (!st) continue;
      const std::optional<int32_t> v = tracer_->value_at(p.key, "a deferred result");
      INGOT_INTERNAL_CHECK(v.has_value(), "segments: a live deferred output has no value");
      fills.push_back(Fill{std::move(st), p.key});
      outs.push_back(*v);
    }
    Graph g = tracer_->finish_segment(std::move(outs));
    std::vector<GraphInput> bound = g.inputs;
    const int64_t nodes = static_cast<int64_t>(g.nodes.size());
    const uint64_t key = segment_key(g);
    const int64_t position = static_cast<int64_t>(lines_.size());
    SegmentCache::Entry uncached;
    auto found = cache_.entries.find(key);
    if (found == cache_.entries.end() && cache_.keys_at[position] > opts_.recompile_limit) {
      // Note [Segments that keep changing]: a host value fed back into ops as an attribute (x * loss.item())
      // makes a new graph at every call; past recompile_limit such a segment runs node by node, uncached.
      warn_once("limit " + std::to_string(position),
                detail::str_cat("warning: segment ", position + 1, " of '", opts_.name, "' changed structure more than ",
                                "recompile_limit (", opts_.recompile_limit, ") times (a value read on the host and ",
                                "used as an op attribute?); new versions of it run op by op with the eager kernels"));
      uncached.exe = node_by_node(std::move(g), &uncached.info);
    } else if (found == cache_.entries.end()) {
      ++cache_.keys_at[position];
      found = cache_.entries.emplace(key, SegmentCache::Entry{}).first;
      compile(std::move(g), found->second);
    }
    SegmentCache::Entry& e = uncached.exe ? uncached : found->second;
    Executable& exe = *e.exe;
    INGOT_INTERNAL_CHECK(exe.graph.inputs.size() >= bound.size(), "segments: passes removed graph inputs");
    std::set<const Storage*> forbidden;  // buffers a stand-in must not take over
    for (size_t i = 0; i < exe.graph.inputs.size(); ++i) {
      GraphInput& in = exe.graph.inputs[i];
      if (i < bound.size()) {
        INGOT_INTERNAL_CHECK(in.role == bound[i].role, "segments: input ", i, " changed role");
        in.tensor = bound[i].tensor;
        in.produce = bound[i].produce;
        in.grad_of = nullptr;
      }
      if (in.tensor.defined() && in.tensor.storage()) forbidden.insert(in.tensor.storage().get());
    }
    std::vector<Tensor> results;
    try {
      results = execute(exe, {});
    } catch (...) {
      unbind(exe, bound.size());
      throw;
    }
    unbind(exe, bound.size());
    std::set<const Storage*> used;
    for (size_t k = 0; k < fills.size(); ++k) fill(fills[k].storage, fills[k].key, results[k], forbidden, used);
    std::ostringstream os;
    os << "segment " << lines_.size() + 1 << ": " << nodes << " ops -> " << e.info.kernels << " generated kernels, "
       << e.info.launches << " launches" << (e.info.node_by_node ? " (node by node)" : "")
       << "; ends at " << where;
    lines_.push_back(os.str());
    totals_.ops_before += e.info.ops_before;
    totals_.ops_after += e.info.ops_after;
    totals_.fused_groups += e.info.fused_groups;
    totals_.kernels += e.info.kernels;
    totals_.launches += e.info.launches;
    totals_.compute_ops += e.info.compute_ops;
    reset();
  }

  // Drops this run's tensors from the cached executable, so it holds no activations between calls.
  static void unbind(Executable& exe, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      exe.graph.inputs[i].tensor = Tensor();
      exe.graph.inputs[i].produce = nullptr;
    }
  }

  void compile(Graph g, SegmentCache::Entry& e) {
    const auto t0 = std::chrono::steady_clock::now();
    if (log_on(LogKind::Graph)) log(LogKind::Graph, g.str());
    CompileStats s;  // build_executable sets its per-graph fields; the totals are added below
    try {
      Graph copy = g;
      e.exe = build_executable(std::move(copy), opts_, s);
      e.info = SegmentInfo{s.ops_before, s.ops_after, s.fused_groups, s.kernels, s.launches, s.compute_ops, false};
    } catch (const Error& err) {
      warn_once("compile", "warning: a segment of '" + opts_.name + "' did not compile (" + err.what() +
                               "); its ops run one by one with the eager kernels");
      e.exe = node_by_node(std::move(g), &e.info);
    }
    ++stats_.segments_compiled;
    stats_.kernels_generated += s.kernels_generated;
    stats_.kernels_reused += s.kernels_reused;
    stats_.kernels_disk_hits += s.kernels_disk_hits;
    stats_.planned_peak_bytes = std::max(stats_.planned_peak_bytes, s.planned_peak_bytes);
    stats_.unplanned_peak_bytes = std::max(stats_.unplanned_peak_bytes, s.unplanned_peak_bytes);
    stats_.saved_for_backward_bytes += s.saved_for_backward_bytes;  // each segment's own forward and backward
    stats_.recomputed_bytes += s.recomputed_bytes;
    stats_.time.passes_ms += s.time.passes_ms;
    stats_.time.lower_ms += s.time.lower_ms;
    stats_.time.codegen_ms += s.time.codegen_ms;
    stats_.time.total_ms += ms_since(t0);
    stats_.last_graph = e.exe->graph.str();
  }

  // The segment as recorded, each op running its eager kernel in recording order.
  static std::shared_ptr<Executable> node_by_node(Graph g, SegmentInfo* info) {
    auto exe = std::make_shared<Executable>();
    exe->steps = plan_steps(g);
    exe->graph = std::move(g);
    *info = SegmentInfo{};
    info->ops_before = info->ops_after = static_cast<int64_t>(exe->graph.nodes.size());
    for (const Node& n : exe->graph.nodes) info->compute_ops += n.prim->fusion_kind() != FusionKind::View;
    info->launches = info->compute_ops;
    info->node_by_node = true;
    return exe;
  }

  // See Note [Deferred outputs].
  static void fill(const std::shared_ptr<Storage>& st, const TensorKey& key, const Tensor& r,
                   const std::set<const Storage*>& forbidden, std::set<const Storage*>& used) {
    const auto& [sp, offset, shape, strides, dtype] = key;
    INGOT_INTERNAL_CHECK(r.defined() && r.shape() == shape && r.dtype() == dtype, "segments: a deferred output ",
                         "has metadata ", dtype_name(dtype), shape_str(shape), " but its segment computed ",
                         r.defined() ? std::string(dtype_name(r.dtype())) + shape_str(r.shape()) : "nothing");
    if (numel(shape) == 0) return;
    const Storage* rs = r.storage().get();
    const size_t bytes = static_cast<size_t>(numel(shape)) * itemsize(dtype);
    if (offset == 0 && strides == contiguous_strides(shape) && st->nbytes == bytes && r.is_contiguous() &&
        r.device() == st->device && !forbidden.count(rs) && used.insert(rs).second) {
      st->data = std::shared_ptr<void>(r.storage()->data, r.data_ptr());
      return;
    }
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = st;
    impl->offset = offset;
    impl->shape = shape;
    impl->strides = strides;
    impl->dtype = dtype;
    const uint64_t version = st->version;
    Tensor(impl).copy_(r);
    st->version = version;
  }

  void warn_once(const std::string& what, const std::string& msg) {
    if (cache_.warned.insert(what).second) log(LogKind::GraphBreaks, msg);
  }

  SegmentCache& cache_;
  const CompileOptions& opts_;
  CompileStats& stats_;
  std::unique_ptr<Tracer> tracer_;
  std::vector<Pending> pending_;
  // Storages the pending segment computes (stand-ins, assigned tensors) and reads. Raw pointers: a reused
  // address only causes an unneeded flush.
  std::set<const Storage*> computed_, read_;
  const Primitive* eager_op_ = nullptr;  // the op with no lowering running now
  bool in_view_ = false;                 // a view op's eval is running on stand-ins
  std::vector<std::string> lines_;
  SegmentInfo totals_;
};

thread_local Segmenter* t_segmenter = nullptr;

void host_read_hook(const Tensor& t, const std::source_location& loc) {
  if (t_segmenter) t_segmenter->host_read(t, loc);
}

bool raw_access_hook(const Tensor* dst, const Tensor* src) { return t_segmenter && t_segmenter->raw_access(dst, src); }

class SegmentScope {
 public:
  explicit SegmentScope(Segmenter* s) {
    INGOT_CHECK(trace_observer() == nullptr, "[compile] a compiled function was called while another one is being "
                "traced on this thread (nested compiled calls are not supported)");
    set_trace_observer(s);
    t_segmenter = s;
    set_host_read_hook(&host_read_hook);
    set_raw_access_hook(&raw_access_hook);
  }
  ~SegmentScope() {
    set_trace_observer(nullptr);
    t_segmenter = nullptr;
    set_host_read_hook(nullptr);
    set_raw_access_hook(nullptr);
  }
  SegmentScope(const SegmentScope&) = delete;
  SegmentScope& operator=(const SegmentScope&) = delete;
};

}  // namespace

std::vector<Tensor> run_segmented(const StepFn& fn, const std::vector<Tensor>& args, SegmentCache& cache,
                                  const CompileOptions& opts, CompileStats& stats) {
  Segmenter seg(cache, opts, stats);
  std::vector<Tensor> outs;
  {
    SegmentScope scope(&seg);
    try {
      outs = fn(args);
    } catch (...) {
      // Eager would have run every op before the throw: so does the pending segment, if it can.
      try {
        seg.end_segment("an exception", std::nullopt);
      } catch (...) {
      }
      throw;
    }
    seg.end_segment("the end of the function", std::nullopt);
  }
  stats.graphs = seg.segments();
  stats.segments = seg.lines();
  const SegmentInfo& t = seg.totals();
  stats.ops_before = t.ops_before;
  stats.ops_after = t.ops_after;
  stats.fused_groups = t.fused_groups;
  stats.kernels = t.kernels;
  stats.launches = t.launches;
  stats.compute_ops = t.compute_ops;
  return outs;
}

}  // namespace ingot::compiler
