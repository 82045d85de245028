// The Tracer behind compile/trace/trace.h and compile/trace/segments.h (internal to compile/): a TraceObserver that turns
// primitive applications, gradient accumulation, in-place assignments and host inputs into a Graph. See
// Note [Tensor identity while tracing] (compile/trace/trace.h) for how tensors are matched to values.
//
// Two modes. Trace: the whole function, run eagerly, becomes one graph (args are Arg inputs, externals are
// classified Captured or Constant when the trace ends, new .grads are GradOuts). Defer: one segment of a
// deferred call (compile/trace/segments.cpp): every external is a Captured input rebound at each run (an
// activation an earlier segment produced differs from call to call, so nothing is Constant), host inputs are
// the tensors this call already made (no re-production), and .grad is set by on_accumulate_grad itself.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>

#include "compile/trace/trace.h"

namespace ingot::compiler {

enum class TraceMode { Trace, Defer };

// See Note [Tensor identity while tracing].
using TensorKey = std::tuple<const Storage*, int64_t, Shape, Strides, DType>;
TensorKey key_of(const Tensor& t);
std::string base_name(const char* path);
inline constexpr const char* kHostReadBreak =
    "a traced value is read on the host (item()/to_vector(): data-dependent control flow)";

class Tracer final : public TraceObserver {
 public:
  Tracer(const std::vector<Tensor>& args, bool fullgraph, TraceMode mode = TraceMode::Trace);

  void on_apply(const std::shared_ptr<Primitive>& p, const std::vector<Tensor>& inputs,
                const std::vector<Tensor>& outputs, const std::source_location& loc) override;
  void on_accumulate_grad(const std::shared_ptr<TensorImpl>& leaf, const Tensor& grad) override;
  void on_assign(const Tensor& dst, const Tensor& src) override;
  bool on_apply_over(const std::shared_ptr<Primitive>& p, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor>& dsts, const std::function<void()>& run,
                     const std::source_location& loc) override;
  void on_host_input(const Tensor& t, std::function<Tensor()> produce) override;
  // Trace mode: Note [Inputs bound just in time] (compile/ir/graph.h); the host work each run repeats.
  bool on_inputs_bound_just_in_time(const std::vector<Tensor>& ts, std::function<std::vector<Tensor>()> bind,
                                    std::function<void()> done) override;
  bool on_run_host_work(std::function<void()> before_backward, std::function<void()> at_end) override;
  // Trace mode: a host read of a traced value is a graph break.
  void on_host_read(const Tensor& t, const std::source_location& loc);

  // Trace mode: the whole graph, the eager results, the breaks.
  TraceResult finish(const std::vector<Tensor>& outs);
  // Defer mode: the segment recorded so far with `outputs` as its results, plus its write-backs.
  Graph finish_segment(std::vector<int32_t> outputs);

  // The value currently bound to `key`: nullopt when none (or its storage died); throws when the binding is
  // stale (a view of it was overwritten after it was taken).
  std::optional<int32_t> value_at(const TensorKey& key, std::string_view user);
  const Graph& graph() const { return g_; }
  bool has_writes() const { return !assigned_.empty(); }
  // Trace mode: the first reason a later call could not defer this function's ops (an op's shape rule
  // disagrees with what its kernel returned), or empty.
  const std::string& defer_blocker() const { return defer_blocker_; }

 private:
  std::optional<int32_t> lookup(const Tensor& t);
  int32_t value_of(const Tensor& t, std::string_view user, const std::source_location& loc);
  void bind(const Tensor& t, int32_t v);
  // The node of `p` applied to `inputs` (graph breaks and the shape rule checked while tracing), its outputs
  // described by `outputs`; returns its output values, bound to nothing yet.
  std::vector<int32_t> add_applied(const std::shared_ptr<Primitive>& p, const std::vector<Tensor>& inputs,
                                   const std::vector<Tensor>& outputs, const std::source_location& loc);
  // `dst`, whose value was `was`, now holds value `now` (an in-place write): other views of its storage go stale and
  // a captured input gets its write-back.
  void assign_value(const Tensor& dst, int32_t was, int32_t now);
  void add_break(std::string reason, const std::source_location& loc);
  void check_shape_rule(const Primitive& p, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs);

  struct Entry {
    std::weak_ptr<Storage> storage;
    int32_t value = -1;
    bool stale = false;  // a view of a tensor that was overwritten in place after the view was taken
  };

  bool fullgraph_ = false;
  TraceMode mode_ = TraceMode::Trace;
  Graph g_;
  std::map<TensorKey, Entry> map_;
  std::map<int32_t, TensorKey> assigned_;  // captured input -> the key whose current value is written back
  std::set<std::shared_ptr<TensorImpl>> grad_params_;
  std::vector<GraphBreak> breaks_;
  std::string defer_blocker_;
  // Tensors registered to be bound just in time, not read yet: (group, index) of Graph::just_in_time.
  struct JustInTime {
    std::weak_ptr<Storage> storage;
    int32_t group = -1, index = -1;
  };
  std::map<TensorKey, JustInTime> just_in_time_;
};

// Why `p` cannot run from a compiled graph (compile/lower/lowering.h) or was excluded with disallow_in_graph.
std::optional<std::string> break_reason(const Primitive& p);

}  // namespace ingot::compiler
