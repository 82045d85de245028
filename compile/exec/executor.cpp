#include "compile/exec/executor.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "autograd/primitive_multi_tensor.h"
#include "compile/logs.h"
#include "runtime/allocator.h"
#include "runtime/allocator_census.h"

namespace ingot::compiler {

// Note [In-place optimizer update]: the update may write into a parameter's (or state's) own buffer when
// the graph reads that input nowhere after the update and writes the matching output back into it: the
// write-back then finds the value already in place (compile/exec/executor.cpp skips the copy).
namespace {
// Why in_place_ok refuses, or "" when it does not: INGOT_LOGS=memory names what keeps an update's copy alive (a
// parameter's updated copy lives until the step's write-back: its whole size at the peak).
std::string in_place_refusal(const Graph& g, int32_t node_index, int32_t in_value, int32_t out_value) {
  const Value& in = g.values[static_cast<size_t>(in_value)];
  if (in.producer >= 0) return detail::str_cat("it is made by node ", in.producer, ", not a graph input");
  for (size_t i = static_cast<size_t>(node_index) + 1; i < g.nodes.size(); ++i)
    for (int32_t v : g.nodes[i].inputs)
      if (v == in_value)
        return detail::str_cat("node ", i, " (", g.nodes[i].prim->name(), ") reads it later");
  for (int32_t o : g.outputs)
    if (o == in_value) return "it is an output of the graph";
  for (const WriteBack& w : g.writebacks)
    if (w.input == in.input_index)
      return w.value == out_value ? "" : detail::str_cat("its write-back is %", w.value, ", not this output");
  return "it has no write-back";
}
}  // namespace

bool in_place_ok(const Graph& g, int32_t node_index, int32_t in_value, int32_t out_value) {
  return in_place_refusal(g, node_index, in_value, out_value).empty();
}

std::vector<ExecStep> plan_steps(const Graph& g, const std::map<int32_t, GroupKernel>& group_kernels) {
  std::vector<ExecStep> steps;
  std::vector<int32_t> last(g.values.size(), -1);
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (int32_t v : g.nodes[n].inputs)
      if (v >= 0) last[static_cast<size_t>(v)] = static_cast<int32_t>(n);
  // Values no node reads are dead right after they are made (unless they are roots).
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (int32_t v : g.nodes[n].outputs)
      if (last[static_cast<size_t>(v)] < 0) last[static_cast<size_t>(v)] = static_cast<int32_t>(n);
  std::vector<bool> root(g.values.size(), false);
  for (int32_t o : g.outputs) root[static_cast<size_t>(o)] = true;
  for (const WriteBack& w : g.writebacks) root[static_cast<size_t>(w.value)] = true;
  for (const GradOut& go : g.grad_outs)
    if (go.value >= 0) root[static_cast<size_t>(go.value)] = true;
  std::vector<int32_t> step_of(g.nodes.size());
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const int32_t G = g.nodes[n].group;
    auto k = G >= 0 ? group_kernels.find(G) : group_kernels.end();
    if (k != group_kernels.end() && !steps.empty() && steps.back().group == G) {
      step_of[n] = static_cast<int32_t>(steps.size() - 1);
      continue;
    }
    ExecStep s;
    s.node = static_cast<int32_t>(n);
    if (k != group_kernels.end()) {
      s.group = G;
      s.kernel = k->second.run;
      s.host_scalars = k->second.host_scalars;
    }
    // Note [In-place optimizer update] for an update that runs as its own node (AdamW8bit's eager kernel): over its
    // inputs when the graph lets every written one be overwritten, not over copies of them.
    const Node& node = g.nodes[n];
    if (const auto* u = dynamic_cast<const InPlaceUpdate*>(node.prim.get()); u && !s.kernel) {
      const std::vector<size_t> w = u->written_inputs();
      bool ok = !w.empty() && w.size() == node.outputs.size();
      for (size_t i = 0; ok && i < w.size(); ++i) {
        const std::string why = in_place_refusal(g, static_cast<int32_t>(n), node.inputs[w[i]], node.outputs[i]);
        ok = why.empty();
        if (!ok && log_on(LogKind::Memory)) {
          const Value& in = g.values[static_cast<size_t>(node.inputs[w[i]])];
          const std::string name = in.input_index >= 0 ? g.inputs[static_cast<size_t>(in.input_index)].name
                                                       : detail::str_cat("%", in.id);
          log(LogKind::Memory, detail::str_cat("memory: node ", n, " (", node.prim->name(), ") updates copies, not '",
                                               name, "' in place: ", why));
        }
      }
      s.update_in_place = ok;
    }
    step_of[n] = static_cast<int32_t>(steps.size());
    steps.push_back(std::move(s));
  }
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (int32_t v : g.nodes[n].outputs)
      if (g.values[static_cast<size_t>(v)].placed_in >= 0)
        steps[static_cast<size_t>(step_of[n])].placed.push_back(v);
  for (size_t v = 0; v < g.values.size(); ++v)
    if (last[v] >= 0 && !root[v])
      steps[static_cast<size_t>(step_of[static_cast<size_t>(last[v])])].release.push_back(static_cast<int32_t>(v));
  // Note [Inputs bound just in time]: each group from the first step reading one of its inputs to the last step
  // reading one, making one's write-back or reading that write-back.
  if (!g.just_in_time.empty()) {
    std::vector<int32_t> first_step(g.just_in_time.size(), -1), last_step(g.just_in_time.size(), -1);
    auto span = [&](int32_t group, int32_t node) {
      if (node < 0) return;
      const int32_t s = step_of[static_cast<size_t>(node)];
      int32_t& f = first_step[static_cast<size_t>(group)];
      f = f < 0 ? s : std::min(f, s);
      last_step[static_cast<size_t>(group)] = std::max(last_step[static_cast<size_t>(group)], s);
    };
    const std::vector<std::vector<int32_t>> readers = g.readers();
    for (const GraphInput& in : g.inputs)
      if (in.jit >= 0)
        for (int32_t n : readers[static_cast<size_t>(in.value)]) span(in.jit, n);
    for (const WriteBack& w : g.writebacks) {
      const int32_t group = g.inputs[static_cast<size_t>(w.input)].jit;
      if (group < 0 || first_step[static_cast<size_t>(group)] < 0) continue;
      span(group, g.values[static_cast<size_t>(w.value)].producer);
      for (int32_t n : readers[static_cast<size_t>(w.value)]) span(group, n);
    }
    for (size_t j = 0; j < g.just_in_time.size(); ++j) {
      if (first_step[j] < 0) continue;  // never read: never bound
      steps[static_cast<size_t>(first_step[j])].bind_before.push_back(static_cast<int32_t>(j));
      steps[static_cast<size_t>(last_step[j])].done_after.push_back(static_cast<int32_t>(j));
    }
  }
  if (!g.before_backward.empty()) {
    int32_t last_forward = -1;
    for (size_t n = 0; n < g.nodes.size(); ++n)
      if (g.nodes[n].forward) last_forward = step_of[n];
    if (static_cast<size_t>(last_forward + 1) < steps.size()) steps[static_cast<size_t>(last_forward + 1)].before_backward = true;
  }
  return steps;
}

namespace {
bool shares_storage(const Tensor& a, const std::set<const Storage*>& s) { return s.count(a.storage().get()) != 0; }
}  // namespace

std::vector<Tensor> bind_inputs(const Graph& g, const std::vector<Tensor>& args, std::set<const Storage*>* captured) {
  std::vector<Tensor> env(g.values.size());
  for (const GraphInput& in : g.inputs) {
    Tensor t;
    switch (in.role) {
      case InputRole::Arg: t = args.at(static_cast<size_t>(in.arg)); break;
      case InputRole::Captured:
        if (in.jit >= 0) continue;  // bound before its first reader (Note [Inputs bound just in time])
        t = in.grad_of ? Tensor(in.grad_of->grad) : in.tensor;
        INGOT_CHECK(t.defined(), "[compile] captured tensor '", in.name, "' is undefined at run time (a .grad that ",
                    "existed when the function was traced is gone; call zero_grad() consistently)");
        captured->insert(t.storage().get());
        break;
      case InputRole::Constant: t = in.tensor; break;
      case InputRole::Host: t = in.produce(); break;
    }
    env[static_cast<size_t>(in.value)] = t.detach();
  }
  return env;
}

namespace {
// Note [Outputs over dead inputs] (autograd/primitive.h): input k's buffer is free for the output when it is
// a whole dense buffer whose every holder is a value released by this step: a graph input (the caller holds
// it), a value read later or a view of one still in env holds its own reference and keeps the count higher.
bool dead_after(const std::vector<int32_t>& release, const std::vector<Tensor>& env, const std::vector<Tensor>& ins,
                size_t k) {
  if (k >= ins.size() || !ins[k].defined() || !ins[k].is_contiguous() || ins[k].offset() != 0) return false;
  const std::shared_ptr<Storage>& st = ins[k].storage();
  if (!st || static_cast<int64_t>(ins[k].nbytes()) != static_cast<int64_t>(st->nbytes)) return false;
  long holders = 0;
  for (int32_t r : release) {
    const Tensor& t = env[static_cast<size_t>(r)];
    if (t.defined() && t.storage() == st) ++holders;
  }
  return holders > 0 && st.use_count() == holders;
}

// Note [Values placed in buckets] (compile/ir/graph.h): value v's slice of its bucket's buffer, which the first
// placed producer of a run makes (the bucket's own node, later, only views it: compile/passes/bucket_views.h).
std::mutex g_bucket_allocator_mu;
BucketAllocator g_bucket_allocator;

Tensor bucket_slot(const Graph& g, int32_t v, std::vector<Tensor>& env) {
  const Value& val = g.values[static_cast<size_t>(v)];
  Tensor& bucket = env[static_cast<size_t>(val.placed_in)];
  if (!bucket.defined()) {
    const Value& b = g.values[static_cast<size_t>(val.placed_in)];
    BucketAllocator allocate;
    {
      std::lock_guard<std::mutex> lock(g_bucket_allocator_mu);
      allocate = g_bucket_allocator;
    }
    bucket = allocate ? allocate(&g, val.placed_in, trace_shape(b.shape), b.dtype, b.device)
                      : empty(trace_shape(b.shape), b.dtype, b.device);
  }
  const Shape shape = trace_shape(val.shape);
  return bucket.as_strided(shape, contiguous_strides(shape), bucket.offset() + val.placed_at);
}

// Both hold the same elements contiguously from the same place (b is a slot, contiguous).
bool same_place(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.offset() == b.offset() && a.is_contiguous();
}

// The values node `n` reads, in its input order (undefined for an absent optional input).
std::vector<Tensor> node_inputs(const Node& n, const std::vector<Tensor>& env) {
  std::vector<Tensor> ins;
  ins.reserve(n.inputs.size());
  for (int32_t v : n.inputs) ins.push_back(v >= 0 ? env[static_cast<size_t>(v)] : Tensor());
  return ins;
}

// Note [In-place optimizer update] for an update that runs its own eager kernel: over its inputs, each output then
// the input it overwrote.
void run_update_in_place(const Graph& g, const ExecStep& s, std::vector<Tensor>& env) {
  const Node& n = g.nodes[static_cast<size_t>(s.node)];
  const auto* u = dynamic_cast<const InPlaceUpdate*>(n.prim.get());
  const std::vector<Tensor> ins = node_inputs(n, env);
  u->update_in_place(ins);
  const std::vector<size_t> w = u->written_inputs();
  for (size_t i = 0; i < w.size(); ++i) env[static_cast<size_t>(n.outputs[i])] = ins[w[i]];
}

// A node step whose outputs are placed: an op that writes given outputs computes into the slots; any other op
// (a group that did not lower, an op without eval_to) computes as usual and its result is copied there, so a
// placed value is always in its slot after its step.
void run_placed_node(const Graph& g, const ExecStep& s, std::vector<Tensor>& env) {
  const Node& n = g.nodes[static_cast<size_t>(s.node)];
  if (!n.prim->writes_given_outputs()) {
    run_node(n, s.release, env);
    return;
  }
  std::vector<Tensor> ins = node_inputs(n, env), outs;
  for (int32_t o : n.outputs) {
    const Value& val = g.values[static_cast<size_t>(o)];
    outs.push_back(val.placed_in >= 0 ? bucket_slot(g, o, env) : empty(trace_shape(val.shape), val.dtype, val.device));
  }
  n.prim->eval_to(ins, outs);
  for (size_t i = 0; i < outs.size(); ++i) env[static_cast<size_t>(n.outputs[i])] = outs[i];
}
}  // namespace

void run_step(const Graph& g, const ExecStep& s, std::vector<Tensor>& env) {
  if (s.kernel) {
    // A generated kernel writes each placed output into the slot found in env (compile/exec/kernel_step.cpp).
    for (int32_t v : s.placed) env[static_cast<size_t>(v)] = bucket_slot(g, v, env);
    s.kernel(env);
  } else if (s.update_in_place) {
    run_update_in_place(g, s, env);
  } else if (!s.placed.empty()) {
    run_placed_node(g, s, env);
  } else {
    run_node(g.nodes[static_cast<size_t>(s.node)], s.release, env);
  }
  for (int32_t v : s.placed) {
    Tensor& t = env[static_cast<size_t>(v)];
    if (!t.defined()) continue;  // a kernel's member that is not one of its outputs
    Tensor slot = bucket_slot(g, v, env);
    if (!same_place(t, slot)) slot.copy_(t);
    t = slot;
  }
}

void run_node(const Node& n, const std::vector<int32_t>& release, std::vector<Tensor>& env) {
  const std::vector<Tensor> ins = node_inputs(n, env);
  const std::optional<size_t> k = n.prim->reusable_input();
  std::vector<Tensor> outs =
      k && dead_after(release, env, ins, *k) ? n.prim->eval_into(ins, ins[*k]) : n.prim->eval(ins);
  for (size_t i = 0; i < outs.size(); ++i) env[static_cast<size_t>(n.outputs[i])] = std::move(outs[i]);
}

std::pair<size_t, size_t> step_node_range(const Executable& exe, size_t i) {
  const size_t b = static_cast<size_t>(exe.steps[i].node);
  const size_t e = i + 1 < exe.steps.size() ? static_cast<size_t>(exe.steps[i + 1].node) : exe.graph.nodes.size();
  return {b, e};
}

std::vector<Tensor> finish(const Graph& g, const std::vector<Tensor>& env, const std::set<const Storage*>& captured) {
  // Results must not alias what the write-backs overwrite or each other's .grad buffers.
  auto owned = [&](int32_t v) {
    Tensor t = env[static_cast<size_t>(v)];
    return shares_storage(t, captured) ? t.clone_raw() : t;
  };
  std::vector<Tensor> outs;
  for (int32_t o : g.outputs) outs.push_back(owned(o));
  std::vector<Tensor> wb;
  for (const WriteBack& w : g.writebacks) {
    if (g.inputs[static_cast<size_t>(w.input)].jit >= 0) {  // written back when its group was handed back
      wb.emplace_back();
      continue;
    }
    const Tensor& src = env[static_cast<size_t>(w.value)];
    const Tensor& dst = g.inputs[static_cast<size_t>(w.input)].tensor;
    wb.push_back(src.storage() == dst.storage() ? src : owned(w.value));
  }
  std::set<const Storage*> given;
  for (const GradOut& go : g.grad_outs) {
    if (go.value < 0) {
      go.param->grad.reset();
      continue;
    }
    Tensor t = owned(go.value);
    if (!t.is_contiguous() || t.offset() != 0 || !given.insert(t.storage().get()).second) t = t.clone_raw();
    go.param->grad = t.impl_ptr();
  }
  for (size_t i = 0; i < g.writebacks.size(); ++i) {
    if (g.inputs[static_cast<size_t>(g.writebacks[i].input)].jit >= 0) continue;
    Tensor dst = g.inputs[static_cast<size_t>(g.writebacks[i].input)].tensor;
    const Tensor& src = env[static_cast<size_t>(g.writebacks[i].value)];
    // Already in place (Note [In-place optimizer update], compile/exec/kernel_step.cpp).
    if (src.storage() == dst.storage() && src.offset() == dst.offset() && src.strides() == dst.strides()) {
      dst.bump_version();
      continue;
    }
    dst.copy_(wb[i]);
  }
  return outs;
}

namespace {

// run_step reported to the profiler: ops run one by one as ops, generated kernels by the ops they fuse.
void run_step_profiled(const Executable& exe, size_t i, std::vector<Tensor>& env, OpProfilerHook& prof) {
  const Graph& g = exe.graph;
  const ExecStep& s = exe.steps[i];
  const auto [begin, end] = step_node_range(exe, i);
  std::vector<Tensor> ins, outs;
  std::string name;
  for (size_t n = begin; n < end; ++n) {
    if (s.kernel) name += std::string(name.empty() ? "fused:" : "+") + std::string(g.nodes[n].prim->name());
    for (int32_t v : g.nodes[n].inputs) ins.push_back(v >= 0 ? env[static_cast<size_t>(v)] : Tensor());
  }
  if (name.size() > 120) name = name.substr(0, 117) + "...";
  const Primitive& first = *g.nodes[begin].prim;
  if (s.kernel) prof.begin_kernel(name);
  else prof.begin_op(first);
  run_step(g, s, env);
  for (size_t n = begin; n < end; ++n)
    for (int32_t v : g.nodes[n].outputs) outs.push_back(env[static_cast<size_t>(v)]);
  if (s.kernel) prof.end_kernel(name, outs);
  else prof.end_op(first, ins, outs);
}

// INGOT_LOGS=memory: where in the step the allocator of the graph's device held the most, and what was alive;
// then the census of that allocator's peak (Note [Allocation census], runtime/allocator_census.h): the graph
// inputs are named by what they are when bound, the bytes made during the run by their step's values after it
// ran, so what holds the rest shows as the census's other owners.
class MemoryWatch {
 public:
  MemoryWatch(const Graph& g, const std::vector<Tensor>& env)
      : g_(g), dev_(compute_device(g).value_or(Device::cpu())), alloc_(&allocator_for(dev_)),
        running_(kRunning) {
    census::reset_peak(dev_);
    std::vector<bool> written(g.inputs.size(), false);
    for (const WriteBack& w : g.writebacks) written[static_cast<size_t>(w.input)] = true;
    for (size_t k = 0; k < g.inputs.size(); ++k) {
      const GraphInput& in = g.inputs[k];
      const Tensor& t = env[static_cast<size_t>(in.value)];
      if (!t.defined() || !t.storage()) continue;
      inputs_.insert(t.storage().get());
      census::attribute(*t.storage(), input_owner(in, written[k], t.dtype()));
    }
  }
  void after(size_t step, const Executable& exe, const std::vector<Tensor>& env) {
    name_values(step, exe, env);
    const int64_t census_peak = census::at_peak(dev_).peak_bytes;
    if (census_peak > census_peak_) {
      census_peak_ = census_peak;
      census_step_ = step;
    }
    const int64_t now = alloc_->stats().allocated_bytes;
    if (now <= peak_) return;
    peak_ = now;
    step_ = step;
    live_.clear();
    std::set<const Storage*> seen;
    for (size_t v = 0; v < env.size(); ++v)
      if (env[v].defined() && env[v].storage() && seen.insert(env[v].storage().get()).second)
        live_.push_back({static_cast<int64_t>(env[v].storage()->nbytes), static_cast<int32_t>(v)});
  }
  void report(const Executable& exe) const {
    if (peak_ < 0) return;
    std::vector<std::pair<int64_t, int32_t>> live = live_;
    std::sort(live.begin(), live.end(), std::greater<>());
    int64_t total = 0, saved = 0;
    for (auto [bytes, v] : live) {
      total += bytes;
      const int32_t p = g_.values[static_cast<size_t>(v)].producer;
      if (p >= 0 && g_.nodes[static_cast<size_t>(p)].forward) saved += bytes;
    }
    std::ostringstream os;
    os << "memory: peak " << peak_ / 1e6 << " MB allocated after step " << step_ << " (" << step_name(exe, step_)
       << "); graph values alive there: " << total / 1e6 << " MB in " << live.size() << " buffers, " << saved / 1e6
       << " MB made by the forward";
    for (size_t i = 0; i < live.size() && i < 12; ++i) {
      const int32_t v = live[i].second;
      const int32_t p = g_.values[static_cast<size_t>(v)].producer;
      os << "\n  " << live[i].first / 1e6 << " MB  %" << v << " " << value_meta_str(g_, v) << " = "
         << (p >= 0 ? std::string(g_.nodes[static_cast<size_t>(p)].prim->name()) : std::string("input"))
         << (p >= 0 && g_.nodes[static_cast<size_t>(p)].forward ? " (forward)" : "");
    }
    if (census::on()) {
      os << "\n" << census::format(census::at_peak(dev_), dev_);
      if (census_step_) os << "\n  (reached during step " << *census_step_ << ", " << step_name(exe, *census_step_) << ")";
    }
    log(LogKind::Memory, os.str());
  }

  // Values this step releases whose bytes something outside the graph still holds (a collective in flight, a
  // .grad handed out, the caller) are that holder's from now on: the census tells them from live graph values.
  void releasing(const std::vector<int32_t>& release, const std::vector<Tensor>& env) const {
    if (!census::on()) return;
    std::set<int32_t> going(release.begin(), release.end());
    for (int32_t r : release) {
      const Tensor& t = env[static_cast<size_t>(r)];
      if (!t.defined() || !t.storage() || inputs_.count(t.storage().get())) continue;
      const Storage* st = t.storage().get();
      // Per impl of the storage in env: env's handles to it, and all of them.
      std::map<const TensorImpl*, std::pair<long, long>> handles;
      bool stays = false;
      for (size_t v = 0; v < env.size() && !stays; ++v) {
        if (!env[v].defined() || env[v].storage().get() != st) continue;
        stays = !going.count(static_cast<int32_t>(v));
        auto& [in_env, all] = handles[env[v].impl()];
        ++in_env;
        all = env[v].impl_ptr().use_count();
      }
      if (stays) continue;
      long outside = t.storage().use_count() - static_cast<long>(handles.size());
      for (const auto& [impl, n] : handles) outside += n.second - n.first;
      if (outside > 0) census::attribute(*t.storage(), kHeldOutside);
    }
  }

 private:
  static constexpr const char* kRunning = "compiled step: made by the running step, or held outside the graph";
  static constexpr const char* kHeldOutside =
      "compiled step: released by the graph, still held outside it (collectives in flight, the caller)";

  static std::string input_owner(const GraphInput& in, bool written, DType dtype) {
    switch (in.role) {
      case InputRole::Arg: return "graph inputs: the step's arguments";
      case InputRole::Constant:
      case InputRole::Host: return "graph inputs: constants";
      case InputRole::Captured: break;
    }
    if (in.grad_of) return "graph inputs: gradients (.grad)";
    return std::string(written ? "graph inputs updated by the step (weights, shards, masters, optimizer state): "
                               : "graph inputs read only: ") +
           std::string(dtype_name(dtype));
  }

  std::string step_name(const Executable& exe, size_t step) const {
    const ExecStep& s = exe.steps[step];
    return s.kernel && s.group >= 0 ? g_.groups[static_cast<size_t>(s.group)].name
                                    : std::string(g_.nodes[static_cast<size_t>(s.node)].prim->name());
  }

  // The blocks step `step` made for its values (not views of inputs or of earlier values) get their owner.
  void name_values(size_t step, const Executable& exe, const std::vector<Tensor>& env) const {
    if (!census::on()) return;
    const auto [begin, end] = step_node_range(exe, step);
    for (size_t n = begin; n < end; ++n) {
      const Node& node = g_.nodes[n];
      for (int32_t v : node.outputs) {
        const Tensor& t = env[static_cast<size_t>(v)];
        if (!t.defined() || !t.storage() || inputs_.count(t.storage().get()) ||
            census::owner_of(*t.storage()) != kRunning)
          continue;
        const std::string_view op = node.prim->name();
        const char* owner = op.rfind("all_gather", 0) == 0 ? "graph values: gathered unit weights"
                            : op.rfind("reduce_scatter", 0) == 0 || op.rfind("all_reduce", 0) == 0
                                ? "graph values: collectives' results"
                            : node.forward ? "graph values: made by the forward"
                                           : "graph values: made by the backward and the update";
        census::attribute(*t.storage(), owner);
      }
    }
  }

  const Graph& g_;
  Device dev_;
  Allocator* alloc_;
  census::Owner running_;  // what the run allocates is the running step's until named
  std::set<const Storage*> inputs_;
  int64_t peak_ = -1;
  size_t step_ = 0;
  std::vector<std::pair<int64_t, int32_t>> live_;
  int64_t census_peak_ = -1;
  std::optional<size_t> census_step_;
};

}  // namespace

void set_bucket_allocator(BucketAllocator allocator) {
  std::lock_guard<std::mutex> lock(g_bucket_allocator_mu);
  g_bucket_allocator = std::move(allocator);
}

namespace {
// Note [Inputs bound just in time] (compile/ir/graph.h): the tensors of each group while it is bound.
class JustInTimeBindings {
 public:
  explicit JustInTimeBindings(const Graph& g)
      : g_(g), bound_(g.just_in_time.size()), inputs_(g.just_in_time.size()), writebacks_(g.just_in_time.size()) {
    for (size_t k = 0; k < g.inputs.size(); ++k)
      if (g.inputs[k].jit >= 0) inputs_[static_cast<size_t>(g.inputs[k].jit)].push_back(static_cast<int32_t>(k));
    for (const WriteBack& w : g.writebacks)
      if (const int32_t group = g.inputs[static_cast<size_t>(w.input)].jit; group >= 0)
        writebacks_[static_cast<size_t>(group)].push_back(w);
  }
  void bind(int32_t group, std::vector<Tensor>& env, std::set<const Storage*>& captured) {
    std::vector<Tensor> ts = g_.just_in_time[static_cast<size_t>(group)].bind();
    for (int32_t k : inputs_[static_cast<size_t>(group)]) {
      const GraphInput& in = g_.inputs[static_cast<size_t>(k)];
      const Value& v = g_.values[static_cast<size_t>(in.value)];
      INGOT_CHECK(static_cast<size_t>(in.jit_index) < ts.size() && ts[static_cast<size_t>(in.jit_index)].defined(),
                  "[compile] '", in.name, "', bound just in time, is missing at run time (", ts.size(), " given)");
      const Tensor& t = ts[static_cast<size_t>(in.jit_index)];
      INGOT_CHECK(t.dtype() == v.dtype && t.shape() == trace_shape(v.shape) && t.device() == v.device,
                  "[compile] '", in.name, "', bound just in time, is ", dtype_name(t.dtype()), shape_str(t.shape()),
                  " on ", t.device().str(), " at run time, traced as ", value_meta_str(g_, v.id), " on ",
                  v.device.str());
      env[static_cast<size_t>(in.value)] = t.detach();
      captured.insert(t.storage().get());
    }
    bound_[static_cast<size_t>(group)] = std::move(ts);
  }
  // Write-backs into the group's tensors (none to copy when the update ran in place), then the group handed back;
  // the run drops its handles to them so that their memory goes when the optimizer lets it go.
  void done(int32_t group, std::vector<Tensor>& env) {
    std::vector<Tensor>& ts = bound_[static_cast<size_t>(group)];
    for (const WriteBack& w : writebacks_[static_cast<size_t>(group)]) {
      const GraphInput& in = g_.inputs[static_cast<size_t>(w.input)];
      Tensor dst = ts[static_cast<size_t>(in.jit_index)];
      Tensor& src = env[static_cast<size_t>(w.value)];
      if (!same_place(src, dst) || src.strides() != dst.strides()) dst.copy_(src);  // bumps its version
      else dst.bump_version();
      if (std::find(g_.outputs.begin(), g_.outputs.end(), w.value) == g_.outputs.end()) src = Tensor();
    }
    for (int32_t k : inputs_[static_cast<size_t>(group)]) env[static_cast<size_t>(g_.inputs[static_cast<size_t>(k)].value)] = Tensor();
    ts.clear();
    g_.just_in_time[static_cast<size_t>(group)].done();
  }

 private:
  const Graph& g_;
  std::vector<std::vector<Tensor>> bound_;
  std::vector<std::vector<int32_t>> inputs_;  // graph input indices per group
  std::vector<std::vector<WriteBack>> writebacks_;  // per group
};
}  // namespace

std::vector<Tensor> execute(const Executable& exe, const std::vector<Tensor>& args) {
  const Graph& g = exe.graph;
  std::set<const Storage*> captured;
  std::vector<Tensor> env = bind_inputs(g, args, &captured);
  OpProfilerHook* prof = op_profiler_hook();
  std::optional<MemoryWatch> watch;
  if (log_on(LogKind::Memory)) watch.emplace(g, env);
  std::optional<JustInTimeBindings> jit;
  if (!g.just_in_time.empty()) jit.emplace(g);
  bool backward_started = false;
  for (size_t i = 0; i < exe.steps.size(); ++i) {
    const ExecStep& s = exe.steps[i];
    if (s.before_backward) {
      for (const auto& f : g.before_backward) f();
      backward_started = true;
    }
    for (int32_t group : s.bind_before) jit->bind(group, env, captured);
    if (prof) run_step_profiled(exe, i, env, *prof);
    else run_step(g, s, env);
    if (watch) watch->after(i, exe, env);
    if (watch) watch->releasing(s.release, env);
    for (int32_t v : s.release) env[static_cast<size_t>(v)] = Tensor();
    for (int32_t group : s.done_after) jit->done(group, env);
  }
  if (!backward_started)
    for (const auto& f : g.before_backward) f();
  std::vector<Tensor> outs = finish(g, env, captured);
  if (watch) watch->report(exe);  // after finish: its write-backs and .grads count too
  for (const auto& f : g.at_end) f();
  return outs;
}

}  // namespace ingot::compiler
