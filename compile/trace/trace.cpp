#include "compile/trace/trace.h"

#include <mutex>

#include "autograd/checkpoint.h"
#include "autograd/ops.h"
#include "compile/trace/tracer.h"

namespace ingot::compiler {

std::string GraphBreak::str() const { return file + detail::str_cat(":", line) + ": " + reason; }

std::string base_name(const char* path) {
  std::string p(path);
  const size_t s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

TensorKey key_of(const Tensor& t) { return {t.storage().get(), t.offset(), t.shape(), t.strides(), t.dtype()}; }

namespace {
std::mutex g_disallowed_mu;
std::map<std::string, std::string, std::less<>> g_disallowed;  // op name -> reason
}  // namespace

void disallow_in_graph(std::string op_name, std::string reason) {
  std::lock_guard<std::mutex> lock(g_disallowed_mu);
  g_disallowed[std::move(op_name)] = std::move(reason);
}

std::optional<std::string> break_reason(const Primitive& p) {
  std::lock_guard<std::mutex> lock(g_disallowed_mu);
  auto it = g_disallowed.find(p.name());
  if (it == g_disallowed.end()) return std::nullopt;
  return std::string(p.name()) + ": " + it->second;
}

Tracer::Tracer(const std::vector<Tensor>& args, bool fullgraph, TraceMode mode) : fullgraph_(fullgraph), mode_(mode) {
  for (size_t i = 0; i < args.size(); ++i) {
    INGOT_CHECK(args[i].defined(), "[compile] argument ", i, " is an undefined tensor");
    const int32_t v = g_.add_input(InputRole::Arg, args[i].dtype(), args[i].device(),
                                   concrete_shape(args[i].shape()), detail::str_cat("arg", i));
    g_.inputs.back().arg = static_cast<int32_t>(i);
    bind(args[i], v);
  }
}

std::vector<int32_t> Tracer::add_applied(const std::shared_ptr<Primitive>& p, const std::vector<Tensor>& inputs,
                                         const std::vector<Tensor>& outputs, const std::source_location& loc) {
  if (mode_ == TraceMode::Trace) {
    if (auto why = break_reason(*p)) add_break(*why, loc);
    if (defer_blocker_.empty()) check_shape_rule(*p, inputs, outputs);
  }
  std::vector<int32_t> ins;
  ins.reserve(inputs.size());
  for (const Tensor& t : inputs) ins.push_back(t.defined() ? value_of(t, p->name(), loc) : -1);
  const int32_t n = g_.add_node(p, std::move(ins), metas_of(outputs), loc);
  Node& node = g_.nodes[static_cast<size_t>(n)];
  node.recomputed = recomputing();  // Note [Recomputed nodes]: grad mode is on, but they run in the backward
  node.forward = grad_enabled() && !node.recomputed;
  return node.outputs;
}

void Tracer::on_apply(const std::shared_ptr<Primitive>& p, const std::vector<Tensor>& inputs,
                      const std::vector<Tensor>& outputs, const std::source_location& loc) {
  const std::vector<int32_t> outs = add_applied(p, inputs, outputs, loc);
  for (size_t k = 0; k < outputs.size(); ++k) bind(outputs[k], outs[k]);
}

// A deferred call (compile/trace/segments.h) makes an op's outputs from its shape rule instead of its kernel, so
// the two must agree; the first disagreement seen while tracing keeps later calls eager.
void Tracer::check_shape_rule(const Primitive& p, const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& outputs) {
  if (p.fusion_kind() == FusionKind::View || break_reason(p)) return;  // evaluated, not inferred, when deferred
  std::vector<TensorMeta> want;
  try {
    want = p.infer(metas_of(inputs));
  } catch (const std::exception& e) {
    defer_blocker_ = std::string(p.name()) + ": its shape rule throws (" + e.what() + ")";
    return;
  }
  bool same = want.size() == outputs.size();
  for (size_t k = 0; same && k < outputs.size(); ++k)
    same = outputs[k].defined() && outputs[k].shape() == want[k].shape && outputs[k].dtype() == want[k].dtype &&
           outputs[k].device() == want[k].device;
  if (!same) defer_blocker_ = std::string(p.name()) + ": its shape rule disagrees with the outputs its kernel returns";
}

void Tracer::on_accumulate_grad(const std::shared_ptr<TensorImpl>& leaf, const Tensor& grad) {
  Tensor g = grad;
  if (g.dtype() != leaf->dtype) g = cast(g, leaf->dtype);
  if (g.shape() != leaf->shape) g = sum_to_shape(g, leaf->shape);
  Tensor next;
  if (leaf->grad) {
    Tensor old(leaf->grad);
    if (!lookup(old)) {
      value_of(old, "grad accumulation", std::source_location::current());
      // Deferred: the segment reads the tensor it saw (leaf->grad is the pending sum by the time it runs).
      if (mode_ == TraceMode::Trace) g_.inputs.back().grad_of = leaf;
    }
    next = add(old, g);
  } else {
    // The eager engine copies so .grad owns its buffer; the graph is pure, so this clone is removable
    // (compile/passes/simplify.cpp) and the executor gives grad outputs their own buffers.
    next = clone(g);
  }
  leaf->grad = next.impl_ptr();
  if (mode_ == TraceMode::Trace) grad_params_.insert(leaf);
}

void Tracer::on_assign(const Tensor& dst, const Tensor& src) {
  const int32_t sv = value_of(src, "in-place update", std::source_location::current());
  const int32_t dv = value_of(dst, "in-place update", std::source_location::current());
  assign_value(dst, dv, sv);
}

void Tracer::assign_value(const Tensor& dst, int32_t was, int32_t now) {
  const TensorKey k = key_of(dst);
  for (auto& [key, e] : map_)
    if (std::get<0>(key) == dst.storage().get() && key != k) e.stale = true;
  map_[k].value = now;
  const Value& d = g_.values[static_cast<size_t>(was)];
  if (d.producer < 0 && !assigned_.count(d.input_index)) assigned_[d.input_index] = k;
}

// The same node and write-backs as on_apply + on_assign, the eager result computed in place by `run`. A deferred
// segment has not computed the inputs yet (its ops run at the segment's end), so there the caller goes the
// functional way.
bool Tracer::on_apply_over(const std::shared_ptr<Primitive>& p, const std::vector<Tensor>& inputs,
                           const std::vector<Tensor>& dsts, const std::function<void()>& run,
                           const std::source_location& loc) {
  if (mode_ != TraceMode::Trace) return false;
  // The node reads the inputs' values as they are before the run, which changes the tensors' contents but not
  // which values their keys name. Every destination's value is looked up before any is reassigned (which makes
  // other views of its storage stale).
  const std::vector<int32_t> outs = add_applied(p, inputs, dsts, loc);
  std::vector<int32_t> was;
  for (const Tensor& d : dsts) was.push_back(value_of(d, p->name(), loc));
  run();
  for (size_t k = 0; k < dsts.size(); ++k) assign_value(dsts[k], was[k], outs[k]);
  return true;
}

void Tracer::on_host_input(const Tensor& t, std::function<Tensor()> produce) {
  const int32_t v = g_.add_input(InputRole::Host, t.dtype(), t.device(), concrete_shape(t.shape()),
                                 detail::str_cat("host ", g_.inputs.size()));
  // Deferred: the host code that made `t` already ran in this call; running `produce` again would advance
  // its counters twice.
  if (mode_ == TraceMode::Defer) produce = [t] { return t; };
  g_.inputs.back().produce = std::move(produce);
  g_.inputs.back().tensor = t;
  bind(t, v);
}

bool Tracer::on_inputs_bound_just_in_time(const std::vector<Tensor>& ts, std::function<std::vector<Tensor>()> bind,
                                          std::function<void()> done) {
  if (mode_ != TraceMode::Trace) return false;
  const int32_t group = static_cast<int32_t>(g_.just_in_time.size());
  g_.just_in_time.push_back(JustInTimeInputs{std::move(bind), std::move(done)});
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    INGOT_CHECK(t.defined() && t.storage(), "[compile] a tensor bound just in time is undefined");
    INGOT_CHECK(!lookup(t), "[compile] a tensor bound just in time ('", t.name(), "') was read by the trace before");
    just_in_time_[key_of(t)] = JustInTime{t.storage(), group, static_cast<int32_t>(i)};
  }
  return true;
}

bool Tracer::on_run_host_work(std::function<void()> before_backward, std::function<void()> at_end) {
  if (mode_ != TraceMode::Trace) return false;
  if (before_backward) g_.before_backward.push_back(std::move(before_backward));
  if (at_end) g_.at_end.push_back(std::move(at_end));
  return true;
}

void Tracer::on_host_read(const Tensor& t, const std::source_location& loc) {
  if (!t.defined() || !t.storage() || !lookup(t)) return;
  const int32_t v = *lookup(t);
  const Value& val = g_.values[static_cast<size_t>(v)];
  if (val.producer < 0 && g_.inputs[static_cast<size_t>(val.input_index)].role == InputRole::Host) return;
  add_break(kHostReadBreak, loc);
}

TraceResult Tracer::finish(const std::vector<Tensor>& outs) {
  TraceResult r;
  for (const Tensor& o : outs) {
    INGOT_CHECK(o.defined(), "[compile] the compiled function returned an undefined tensor");
    g_.outputs.push_back(value_of(o, "function output", std::source_location::current()));
  }
  // Classify externals (see Note [Tensor identity while tracing]): only the trace holds a Constant.
  // Inputs bound just in time stay Captured: the trace holds no handle to them (value_of).
  for (GraphInput& in : g_.inputs)
    if (in.jit < 0 && in.role == InputRole::Captured && !in.grad_of && in.tensor.impl_ptr().use_count() == 1)
      in.role = InputRole::Constant;
  for (const auto& [input, key] : assigned_) {
    if (g_.inputs[static_cast<size_t>(input)].role != InputRole::Captured) continue;
    const int32_t v = map_.at(key).value;
    if (v != g_.inputs[static_cast<size_t>(input)].value) g_.writebacks.push_back(WriteBack{input, v});
  }
  for (const std::shared_ptr<TensorImpl>& p : grad_params_) {
    GradOut go;
    go.param = p;
    if (p->grad) {
      Tensor gt(p->grad);
      go.value = value_of(gt, "grad output", std::source_location::current());
    }
    g_.grad_outs.push_back(go);
  }
  r.graph = std::move(g_);
  r.outputs = outs;
  r.breaks = std::move(breaks_);
  r.defer_blocker = defer_blocker_;
  return r;
}

Graph Tracer::finish_segment(std::vector<int32_t> outputs) {
  g_.outputs = std::move(outputs);
  for (const auto& [input, key] : assigned_) {
    const int32_t v = map_.at(key).value;
    if (v != g_.inputs[static_cast<size_t>(input)].value) g_.writebacks.push_back(WriteBack{input, v});
  }
  return std::move(g_);
}

std::optional<int32_t> Tracer::value_at(const TensorKey& key, std::string_view user) {
  auto it = map_.find(key);
  if (it == map_.end() || it->second.storage.expired()) return std::nullopt;
  INGOT_CHECK(!it->second.stale, "[compile] ", user, ": a view of this tensor was updated in place after it was ",
              "taken; take the view again after the update");
  return it->second.value;
}

std::optional<int32_t> Tracer::lookup(const Tensor& t) {
  auto it = map_.find(key_of(t));
  if (it == map_.end()) return std::nullopt;
  if (it->second.storage.expired()) {  // the storage died and its address was reused
    map_.erase(it);
    return std::nullopt;
  }
  return it->second.value;
}

int32_t Tracer::value_of(const Tensor& t, std::string_view user, const std::source_location& loc) {
  INGOT_CHECK(t.storage() != nullptr, "[compile] ", user, ": a tensor without storage cannot be traced");
  auto it = map_.find(key_of(t));
  if (it != map_.end() && !it->second.storage.expired()) {
    INGOT_CHECK(!it->second.stale, "[compile] ", user, " at ", base_name(loc.file_name()), ":", loc.line(),
                " reads a view of a tensor that was updated in place after the view was taken; take the view ",
                "again after the update");
    return it->second.value;
  }
  // Not produced by a traced op: an external tensor, held by handle (classified in finish()).
  std::string name = t.name().empty() ? detail::str_cat("tensor ", g_.inputs.size()) : t.name();
  const int32_t v = g_.add_input(InputRole::Captured, t.dtype(), t.device(), concrete_shape(t.shape()), name);
  g_.inputs.back().tensor = t;
  if (auto j = just_in_time_.find(key_of(t)); j != just_in_time_.end()) {
    if (j->second.storage.lock() == t.storage()) {
      // Not held by the trace either: the traced step hands each back after its update as a compiled run does
      // (an 8B's 16 GB of offloaded state would otherwise all be on the GPU by the trace's end).
      g_.inputs.back().tensor = Tensor();
      g_.inputs.back().jit = j->second.group;
      g_.inputs.back().jit_index = j->second.index;
    }
    just_in_time_.erase(j);
  }
  bind(t, v);
  return v;
}

void Tracer::bind(const Tensor& t, int32_t v) {
  if (!t.defined() || !t.storage()) return;
  Entry& e = map_[key_of(t)];
  e.storage = t.storage();
  e.value = v;
  e.stale = false;
}

void Tracer::add_break(std::string reason, const std::source_location& loc) {
  INGOT_CHECK(!fullgraph_, "[compile] fullgraph: graph break at ", base_name(loc.file_name()), ":", loc.line(), ": ",
              reason);
  breaks_.push_back(GraphBreak{std::move(reason), base_name(loc.file_name()), static_cast<int>(loc.line())});
}

namespace {

thread_local Tracer* t_tracer = nullptr;

void host_read_hook(const Tensor& t, const std::source_location& loc) {
  if (t_tracer) t_tracer->on_host_read(t, loc);
}

// Installs the tracer for one call and removes it however the call ends.
class TraceScope {
 public:
  explicit TraceScope(Tracer* t) {
    INGOT_CHECK(trace_observer() == nullptr, "[compile] a compiled function was called while another one is being "
                "traced on this thread (nested compiled calls are not supported)");
    set_trace_observer(t);
    t_tracer = t;
    set_host_read_hook(&host_read_hook);
  }
  ~TraceScope() {
    set_trace_observer(nullptr);
    t_tracer = nullptr;
    set_host_read_hook(nullptr);
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
};

}  // namespace

TraceResult trace(const StepFn& fn, const std::vector<Tensor>& args, bool fullgraph) {
  Tracer tracer(args, fullgraph);
  std::vector<Tensor> outs;
  {
    TraceScope scope(&tracer);
    outs = fn(args);
  }
  return tracer.finish(outs);
}

}  // namespace ingot::compiler
