// Primitive: the one definition of an op (MLX-style). A primitive knows its name and attributes, its output
// metadata rule (infer), how to compute its outputs eagerly on any device (eval, which calls the kernels of
// runtime/kernels), and its vector-Jacobian product written with differentiable ops (vjp), so the same
// backward works eagerly and, later, inside a traced graph.
//
// Users never see primitives: free functions in autograd/ops.h build them and call apply().
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace ingot {

// How the compiler may fuse an op (declared by the op, never decided by a list inside the fuser).
enum class FusionKind { Pointwise, Reduction, View, Opaque };

struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};
inline TensorMeta meta_of(const Tensor& t) { return {t.shape(), t.dtype(), t.device()}; }

// What the backward of one application sees. Inputs/outputs are detached aliases (no history), present only
// where the primitive asked to save them (see Primitive::saves_*); metadata is always there.
struct VjpContext {
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::vector<TensorMeta> input_meta;
  std::vector<bool> needs_grad;  // per input
};

class Primitive {
 public:
  virtual ~Primitive() = default;
  virtual std::string_view name() const = 0;
  // Output metadata from input metadata; throws naming the op on invalid inputs.
  virtual std::vector<TensorMeta> infer(const std::vector<TensorMeta>& inputs) const = 0;
  // Computes the outputs eagerly. View primitives return aliases of their input.
  virtual std::vector<Tensor> eval(const std::vector<Tensor>& inputs) const = 0;
  // Gradients w.r.t. each input (an undefined Tensor where !needs_grad or not differentiable). `cotangents`
  // has one entry per output; undefined entries mean zero. Runs with grad mode off.
  virtual std::vector<Tensor> vjp(const VjpContext& ctx, const std::vector<Tensor>& cotangents) const;
  virtual bool differentiable() const { return true; }
  // Which inputs / outputs the backward needs (default: all inputs, no outputs).
  virtual bool saves_input(size_t) const { return true; }
  virtual bool saves_output(size_t) const { return false; }
  // Input i given which inputs get a gradient (apply() asks this one): an op whose gradients read different
  // inputs saves only what the needed ones read, so a linear over a frozen weight (a LoRA base) keeps no input
  // for the weight gradient that never runs. Default: saves_input(i).
  virtual bool saves_input_given(size_t i, const std::vector<bool>& needs_grad) const {
    (void)needs_grad;
    return saves_input(i);
  }
  virtual FusionKind fusion_kind() const { return FusionKind::Opaque; }
  // Whether compile.memory_budget may recompute this op's outputs in the backward instead of keeping them
  // (compile/passes/remat.h) when its inputs are at hand there: ops that cost about one read of their inputs.
  // Default: pointwise ops and views; a row norm (one pass over each row) says so too.
  virtual bool cheap_to_recompute() const {
    return fusion_kind() == FusionKind::Pointwise || fusion_kind() == FusionKind::View;
  }
  // Note [Outputs over dead inputs]: output 0 may be computed into the buffer of input reusable_input() (same
  // shape and dtype; the kernel reads each element before it writes it). An executor that knows nothing else
  // holds that buffer any more calls eval_into, saving an allocation at the step's peak (the cross-entropy
  // gradient over the logits: 1.65 GB for GPT-2 at 16 x 1024).
  virtual std::optional<size_t> reusable_input() const { return std::nullopt; }
  virtual std::vector<Tensor> eval_into(const std::vector<Tensor>& inputs, const Tensor& into) const {
    (void)into;
    return eval(inputs);
  }
  // Note [Outputs into given buffers]: an op whose writes_given_outputs() is true computes eval_to(inputs, outs)
  // into buffers its caller made (contiguous, of the inferred shapes and dtypes, possibly slices of a larger
  // buffer), so the compiled step can place a gradient straight into its slice of a data-parallel bucket
  // (compile/passes/bucket_views.h). The default eval_to evaluates and copies.
  virtual bool writes_given_outputs() const { return false; }
  virtual void eval_to(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outs) const;
  // Both notes at once, for an op that accumulates into input reusable_input() (index_add_accumulate,
  // matmul_accumulate): that input's values are copied into `out` unless its producer already wrote them there
  // (compile/passes/bucket_views.cpp places it in the same slice), then eval_into(inputs, out).
  void eval_into_given(const std::vector<Tensor>& inputs, const Tensor& out) const;
  // Input i is read on the host whatever device the other inputs live on (the optimizers' [G, 3] f64 rows of
  // learning rate, step and grad scale): exempt from the same-device check of apply().
  virtual bool host_input(size_t) const { return false; }
  // Attributes, printed after the name in graphs and errors ("dim=1, keepdim=true"). Doubles go through the
  // stream as they are, so a plain stream shows them at its 6 digits (logs); see exact_attrs.
  virtual void print_attrs(std::ostream&) const {}
  // Same op with the same attributes (what CSE and kernel dedup need). Default compares name and
  // exact_attrs text.
  virtual bool equivalent(const Primitive& other) const;
};

// Note [Exact attributes]: print_attrs on a stream at 17 significant digits, so every floating-point
// attribute round-trips exactly. What compares, hashes or parses attributes uses this, never the 6-digit
// default of a plain stream (x * 1.0000001 printed "alpha=1" and was taken for the identity; x * 0.5000001
// and x * 0.5000002 had one text: CSE merged them and the graph hash could not tell them apart).
std::string exact_attrs(const Primitive& p);

// Note [Typed attributes]: what a compiler pass or the lowering reads of an op's attributes it reads as a
// struct, never as printed text (a printed "dims=[0, 2, 1, 3]" compared against a literal breaks silently when
// the printer changes). An op whose attributes the compiler needs derives from WithAttrs<A>, its attributes
// struct (declared next to the op's family, autograd/ops/attrs.h); match<A>(p) is p's attributes or null.
// Printing, equality and hashing still go through print_attrs / exact_attrs (Note [Exact attributes]).
template <class A>
class WithAttrs {
 public:
  explicit WithAttrs(A a) : attrs_(std::move(a)) {}
  const A& attrs() const { return attrs_; }

 protected:
  A attrs_;
};
template <class A>
const A* match(const Primitive& p) {
  const auto* w = dynamic_cast<const WithAttrs<A>*>(&p);
  return w ? &w->attrs() : nullptr;
}

// Runs `p` on `inputs`: evaluates eagerly and, when grad mode is on and an input requires grad, records a
// tape node so backward() can reach the inputs. `loc` is the user's call site (for error messages).
std::vector<Tensor> apply(std::shared_ptr<Primitive> p, const std::vector<Tensor>& inputs,
                          std::source_location loc = std::source_location::current());
inline Tensor apply1(std::shared_ptr<Primitive> p, const std::vector<Tensor>& inputs,
                     std::source_location loc = std::source_location::current()) {
  return apply(std::move(p), inputs, loc)[0];
}

// Tracing seam (compile/trace/trace.cpp implements it). While an observer is installed on this thread, apply()
// reports every application after evaluating it, and the code that changes persistent tensors outside of
// primitives (gradient accumulation in the engine, the optimizers' in-place updates) reports that too, so a
// whole training step can be recorded as one graph. Null (the default) costs one branch per op.
class TraceObserver {
 public:
  virtual ~TraceObserver() = default;
  virtual void on_apply(const std::shared_ptr<Primitive>& p, const std::vector<Tensor>& inputs,
                        const std::vector<Tensor>& outputs, const std::source_location& loc) = 0;
  // Replaces the engine's accumulation of gradient `g` into `leaf`'s .grad; the observer must set .grad.
  virtual void on_accumulate_grad(const std::shared_ptr<TensorImpl>& leaf, const Tensor& g) = 0;
  // `dst` (a parameter, optimizer state) was overwritten in place with `src`'s value (already copied).
  virtual void on_assign(const Tensor& dst, const Tensor& src) = 0;
  // `p` applied to `inputs` with its k-th output written over dsts[k] (one of the inputs: a parameter, optimizer
  // state) by `run`, which the observer calls after reading the inputs: recorded as on_apply followed by
  // on_assign(dsts[k], output k), without the outputs' own memory (an optimizer's functional update would hold a
  // second copy of every parameter and state tensor it updates: Note [Traced updates run in place],
  // optim/fused_update.h). Returns false without running anything where it cannot (a deferred segment, whose
  // inputs are not computed yet); the caller then applies `p` and assigns.
  virtual bool on_apply_over(const std::shared_ptr<Primitive>&, const std::vector<Tensor>&, const std::vector<Tensor>&,
                             const std::function<void()>&, const std::source_location&) {
    return false;
  }
  // `t` holds host-computed values that a replay must recompute with `produce` before every run (learning
  // rate, step count); `produce` may advance host counters (it stands in for the host code that made t).
  virtual void on_host_input(const Tensor& t, std::function<Tensor()> produce) = 0;
  // Note [Inputs bound just in time] (compile/ir/graph.h): `ts`, persistent tensors that ops after this call read
  // and may update in place (one parameter's optimizer state, kept in host memory between its updates: Note
  // [Optimizer state offloaded], optim/optimizer.cpp), are bound in each compiled run by `bind` (tensors like `ts`,
  // in order) right before the first step that reads them, and handed back by `done` after the last step that reads
  // or updates them; the graph holds none of them in between. False where the observer cannot (a deferred segment).
  virtual bool on_inputs_bound_just_in_time(const std::vector<Tensor>& ts, std::function<std::vector<Tensor>()> bind,
                                            std::function<void()> done) {
    (void)ts;
    (void)bind;
    (void)done;
    return false;
  }
  // Host work an eager step does around its backward, which a compiled run must do too: `before_backward` once its
  // forward's steps are done, `at_end` after its last step. False where the observer cannot.
  virtual bool on_run_host_work(std::function<void()> before_backward, std::function<void()> at_end) {
    (void)before_backward;
    (void)at_end;
    return false;
  }
  // Deferred execution (compile/trace/segments.h): asked before `p` is evaluated. Outputs returned here stand in
  // for the evaluation (right metadata, data produced later by the observer); nullopt evaluates now. Either
  // way on_apply follows.
  virtual std::optional<std::vector<Tensor>> defer(const std::shared_ptr<Primitive>&, const std::vector<Tensor>&,
                                                   const std::source_location&) {
    return std::nullopt;
  }
};
TraceObserver* trace_observer();
void set_trace_observer(TraceObserver* obs);  // thread-local; pass nullptr to stop

// Profiling seam (recipes/profile.cpp implements it): while a hook is installed, apply() calls begin_op()
// before and end_op() after each eager evaluation, so per-op wall time can be measured. Process-wide;
// null (the default) costs one atomic load per op.
class OpProfilerHook {
 public:
  virtual ~OpProfilerHook() = default;
  virtual void begin_op(const Primitive& p) = 0;
  virtual void end_op(const Primitive& p, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) = 0;
  // Compiled steps (compile/exec/executor.cpp) report each generated kernel too, named after the ops it fuses.
  virtual void begin_kernel(const std::string& name) { (void)name; }
  virtual void end_kernel(const std::string& name, const std::vector<Tensor>& outputs) {
    (void)name;
    (void)outputs;
  }
};
OpProfilerHook* op_profiler_hook();
void set_op_profiler_hook(OpProfilerHook* hook);  // pass nullptr to stop

// Allocates outputs on the inputs' device from an infer() result.
std::vector<Tensor> alloc_outputs(const std::vector<TensorMeta>& metas);
std::vector<TensorMeta> metas_of(const std::vector<Tensor>& ts);

// Grad mode: on by default; NoGradGuard turns recording off in a scope (thread-local).
bool grad_enabled();
void set_grad_enabled(bool on);
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace ingot
