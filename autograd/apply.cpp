#include <atomic>
#include <sstream>

#include "autograd/checkpoint.h"
#include "autograd/node.h"

namespace ingot {
namespace {
thread_local bool t_grad_enabled = true;
thread_local TraceObserver* t_trace_observer = nullptr;
std::atomic<uint64_t> g_seq{0};
std::atomic<OpProfilerHook*> g_profiler_hook{nullptr};

}  // namespace

std::string exact_attrs(const Primitive& p) {
  std::ostringstream os;
  os.precision(17);
  p.print_attrs(os);
  return os.str();
}

bool grad_enabled() { return t_grad_enabled; }
TraceObserver* trace_observer() { return t_trace_observer; }
void set_trace_observer(TraceObserver* obs) { t_trace_observer = obs; }
void set_grad_enabled(bool on) { t_grad_enabled = on; }
OpProfilerHook* op_profiler_hook() { return g_profiler_hook.load(std::memory_order_acquire); }
void set_op_profiler_hook(OpProfilerHook* hook) { g_profiler_hook.store(hook, std::memory_order_release); }

std::vector<Tensor> Primitive::vjp(const VjpContext&, const std::vector<Tensor>&) const {
  INGOT_FAIL(name(), ": backward is not implemented for this op");
}

void Primitive::eval_to(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outs) const {
  const std::vector<Tensor> made = eval(inputs);
  INGOT_INTERNAL_CHECK(made.size() == outs.size(), name(), ": eval_to given ", outs.size(), " outputs, made ",
                       made.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    Tensor out = outs[i];  // a handle: the copy writes the caller's buffer
    if (out.defined() && made[i].data_ptr() != out.data_ptr()) out.copy_(made[i]);
  }
}

void Primitive::eval_into_given(const std::vector<Tensor>& inputs, const Tensor& out) const {
  const std::optional<size_t> k = reusable_input();
  INGOT_INTERNAL_CHECK(k && *k < inputs.size(), name(), ": eval_into_given needs an input to accumulate into");
  const Tensor& base = inputs[*k];
  if (!(base.storage() == out.storage() && base.offset() == out.offset() && base.is_contiguous())) {
    Tensor o = out;  // a handle: the copy writes the caller's buffer
    o.copy_(base);
  }
  eval_into(inputs, out);
}

bool Primitive::equivalent(const Primitive& other) const {
  return name() == other.name() && exact_attrs(*this) == exact_attrs(other);
}

std::vector<TensorMeta> metas_of(const std::vector<Tensor>& ts) {
  std::vector<TensorMeta> m;
  m.reserve(ts.size());
  for (const Tensor& t : ts) m.push_back(t.defined() ? meta_of(t) : TensorMeta{});
  return m;
}

std::vector<Tensor> alloc_outputs(const std::vector<TensorMeta>& metas) {
  std::vector<Tensor> out;
  out.reserve(metas.size());
  for (const TensorMeta& m : metas) out.push_back(empty(m.shape, m.dtype, m.device));
  return out;
}

std::vector<Tensor> apply(std::shared_ptr<Primitive> p, const std::vector<Tensor>& inputs, std::source_location loc) {
  size_t first = inputs.size();  // the first input on the op's device
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || p->host_input(i)) continue;
    if (first == inputs.size()) first = i;
    else
      INGOT_CHECK(inputs[i].device() == inputs[first].device(), p->name(), ": input ", i, " is on ",
                  inputs[i].device().str(), " but input ", first, " is on ", inputs[first].device().str());
  }
  std::vector<Tensor> outs;
  std::optional<std::vector<Tensor>> deferred;
  if (t_trace_observer) deferred = t_trace_observer->defer(p, inputs, loc);
  if (deferred) {
    outs = std::move(*deferred);
  } else {
    OpProfilerHook* prof = g_profiler_hook.load(std::memory_order_acquire);
    if (prof) prof->begin_op(*p);
    outs = p->eval(inputs);
    if (prof) prof->end_op(*p, inputs, outs);
  }

  bool needs = false;
  if (grad_enabled() && p->differentiable())
    for (const Tensor& t : inputs) needs = needs || t.requires_grad();
  if (t_trace_observer) t_trace_observer->on_apply(p, inputs, outs, loc);
  if (!needs) return outs;

  auto node = std::make_shared<Node>();
  node->prim = p;
  node->loc = loc;
  node->seq = g_seq.fetch_add(1);
  node->ctx.input_meta = metas_of(inputs);
  node->ctx.inputs.resize(inputs.size());
  node->ctx.needs_grad.resize(inputs.size());
  node->saved_versions.resize(inputs.size());
  node->next.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) node->ctx.needs_grad[i] = inputs[i].defined() && inputs[i].requires_grad();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) continue;
    if (p->saves_input_given(i, node->ctx.needs_grad)) {
      node->ctx.inputs[i] = t.detach();
      node->saved_versions[i] = t.version();
    }
    if (!t.requires_grad()) continue;
    if (t.impl()->grad_fn) node->next[i] = Edge{t.impl()->grad_fn, t.impl()->output_nr, nullptr};
    else node->next[i] = Edge{nullptr, 0, t.impl_ptr()};
  }
  node->output_meta = metas_of(outs);
  node->ctx.outputs.resize(outs.size());
  for (size_t k = 0; k < outs.size(); ++k) {
    if (p->saves_output(k)) node->ctx.outputs[k] = outs[k].detach();
    if (!is_floating(outs[k].dtype())) continue;
    // View outputs share the input's impl storage but need their own autograd identity.
    TensorImpl* impl = outs[k].impl();
    for (const Tensor& in : inputs)
      if (in.defined() && in.impl() == impl) {
        outs[k] = outs[k].detach();
        impl = outs[k].impl();
      }
    impl->requires_grad = true;
    impl->grad_fn = node;
    impl->output_nr = static_cast<int>(k);
  }
  detail::checkpoint_on_record(*node);
  return outs;
}

}  // namespace ingot
