// The graph IR: one SSA graph per compiled function (a whole training step). Nodes apply autograd
// Primitives (the op's one definition: name, attrs, infer, eval, fusion kind) to values; every value is
// defined once, by a graph input or by one output of one node, and has a dtype, a device and a shape whose
// dims are either concrete or a named symbol ("s0") with a range, for dims compiled dynamic.
//
// Inputs have a role: Arg (the caller's positional tensors: the batch), Captured (persistent tensors the
// function closed over and that may change between calls: parameters, optimizer state, .grad), Constant
// (tensors created while tracing whose value is fixed: foldable) and Host (host-computed tensors such as the
// optimizer's hyper-parameters, re-produced before every run). The graph is pure: an in-place update of a
// persistent tensor is a WriteBack (the input's buffer receives a value after the run), and a new .grad is
// a GradOut. Passes rewrite the node list; value ids stay stable (a removed node's values become unused).
//
// str() prints a readable listing; verify() checks every invariant above and throws naming the broken one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "autograd/primitive.h"

namespace ingot::compiler {

// A dim: concrete (sym < 0) or symbol `sym` of Graph::symbols; `value` is the size seen when tracing.
struct Dim {
  int64_t value = 0;
  int32_t sym = -1;
  bool is_symbolic() const { return sym >= 0; }
  bool operator==(const Dim&) const = default;
};
using SymShape = std::vector<Dim>;
SymShape concrete_shape(const Shape& s);
Shape trace_shape(const SymShape& s);  // the sizes seen when tracing

struct Symbol {
  std::string name;  // "s0"
  int64_t min = 2, max = INT64_MAX;
};

enum class InputRole : uint8_t { Arg, Captured, Constant, Host };
const char* role_name(InputRole r);

struct Value {
  int32_t id = -1;
  DType dtype = DType::f32;
  Device device;
  SymShape shape;
  int32_t producer = -1;  // node id, or -1 for a graph input
  int32_t output_index = 0;
  int32_t input_index = -1;  // index into Graph::inputs when producer < 0
  // Note [Values placed in buckets]: placed_in >= 0 names a 1-d value (a data-parallel bucket,
  // compile/passes/bucket_views.h) whose buffer holds this value's elements, contiguous, from element placed_at
  // on: the executor makes that buffer at the first placed producer and has the producer write there.
  int32_t placed_in = -1;
  int64_t placed_at = 0;
};

struct Node {
  int32_t id = -1;
  std::shared_ptr<Primitive> prim;
  std::vector<int32_t> inputs;  // value ids; -1 = an optional input left undefined (a bias)
  std::vector<int32_t> outputs;
  std::source_location loc;     // the user's call site (reports, errors)
  int32_t group = -1;           // fusion group (compile/passes/fuse.cpp), -1 = runs alone
  bool forward = false;         // recorded with grad mode on (the forward); backward and update run without
  bool recomputed = false;      // Note [Recomputed nodes]
};

// Note [Recomputed nodes]: a checkpointed region's forward ops run again inside the backward (autograd/checkpoint.h)
// and are traced there: backward nodes (forward = false) marked recomputed. They apply the same primitives to the
// same inputs as the forward nodes they repeat, so CSE would merge them back and undo the checkpoint; it merges a
// recomputed node only with another recomputed one. Test: tests/autograd/test_checkpoint.cpp (ActivationCheckpoint.*).

struct GraphInput {
  int32_t value = -1;
  InputRole role = InputRole::Arg;
  std::string name;   // "arg0", "param transformer.wte.weight", "const 3"
  int32_t arg = -1;   // Arg: position in the caller's list
  Tensor tensor;      // Captured / Constant: the tensor read at run time (held by handle)
  std::function<Tensor()> produce;  // Host: re-computes the value before a run
  // Captured tensors reached as another parameter's .grad at entry: the owner (the grad is read from it).
  std::shared_ptr<TensorImpl> grad_of;
  // Note [Inputs bound just in time]: a Captured input bound by Graph::just_in_time[jit].bind()[jit_index] before
  // the first step that reads it (`tensor` is then undefined: the graph holds nothing of it between runs).
  int32_t jit = -1, jit_index = -1;
};

// Note [Inputs bound just in time]
// One parameter's offloaded optimizer state (Note [Optimizer state offloaded], optim/optimizer.cpp) lives in host
// memory between steps and passes through the GPU for its update: a compiled step cannot bind it at the start of a
// run as other captured tensors (that would hold all of it on the GPU at once). Its inputs are bound by `bind` right
// before the first step that reads any of them (the update: the optimizer waits for the copy in there) and handed
// back by `done` after the last step that reads or writes one back (its write-backs are copied in first unless the
// update ran in place: the optimizer then copies them back to the host). What `bind` returns must match the traced
// metadata (checked, naming the input). Not under CUDA graphs (their replay binds every input up front).
// Test: tests/compile/exec/test_just_in_time_inputs.cpp.
struct JustInTimeInputs {
  std::function<std::vector<Tensor>()> bind;
  std::function<void()> done;
};

struct WriteBack {
  int32_t input = -1;  // index into Graph::inputs (Captured): its buffer receives...
  int32_t value = -1;  // ...this value after the run
};
struct GradOut {
  std::shared_ptr<TensorImpl> param;  // param.grad = value after the run (-1: reset to none)
  int32_t value = -1;
};

// Fusion groups: sets of nodes that become one kernel (compile/passes/fuse.cpp).
enum class GroupKind : uint8_t { Pointwise, RowReduction, MultiTensor };
const char* group_kind_name(GroupKind k);
struct FusionGroup {
  int32_t id = -1;
  GroupKind kind = GroupKind::Pointwise;
  std::vector<int32_t> nodes;    // in graph order
  std::vector<int32_t> inputs;   // values read from outside the group
  std::vector<int32_t> outputs;  // values used outside the group (or graph outputs / write-backs)
  std::string name;              // readable: "k3_add_gelu"
};

class Graph {
 public:
  std::vector<Value> values;
  std::vector<Node> nodes;  // topological order (execution order)
  std::vector<GraphInput> inputs;
  std::vector<int32_t> outputs;  // the function's results, in order
  std::vector<WriteBack> writebacks;
  std::vector<GradOut> grad_outs;
  std::vector<Symbol> symbols;
  std::vector<FusionGroup> groups;
  std::vector<JustInTimeInputs> just_in_time;  // Note [Inputs bound just in time]
  // Host work of an eager step that each run repeats (TraceObserver::on_run_host_work): once the steps holding
  // forward nodes are done, and after the last step.
  std::vector<std::function<void()>> before_backward, at_end;

  // Building.
  int32_t add_value(DType dtype, Device device, SymShape shape);
  int32_t add_input(InputRole role, DType dtype, Device device, SymShape shape, std::string name);
  // Appends a node; its outputs get fresh values with the given metadata. Returns the node id.
  int32_t add_node(std::shared_ptr<Primitive> prim, std::vector<int32_t> inputs, const std::vector<TensorMeta>& outs,
                   std::source_location loc = std::source_location::current());
  // Replaces every use of value `from` (node inputs, outputs, write-backs, grad outs) with `to`.
  void replace_uses(int32_t from, int32_t to);
  // Use counts per value over node inputs plus outputs, write-backs and grad outs (the "roots").
  std::vector<int32_t> use_counts() const;
  // The nodes reading each value as an input, each node once, in node order.
  std::vector<std::vector<int32_t>> readers() const;
  bool is_root(int32_t value) const;
  // Renumbers node ids after a pass removed or reordered nodes (values keep their ids).
  void renumber_nodes();
  // A pattern pass's rewrite: node i becomes replace[i] where given, is removed where drop[i], and keeps its
  // place otherwise; then renumber_nodes(). The caller keeps the order topological.
  void rewrite_nodes(std::map<size_t, Node> replace, const std::vector<bool>& drop);
  const Node& producer(int32_t value) const { return nodes.at(static_cast<size_t>(values.at(value).producer)); }

  std::string str() const;  // the printer (compile/ir/printer.cpp)
  void verify() const;      // throws Error "[compile] graph verify: ..." (compile/ir/verify.cpp)
  // A structural hash: ops, attrs, wiring, metadata and input roles; not tensor values or source lines.
  uint64_t structural_hash() const;
};

std::string value_meta_str(const Graph& g, int32_t v);  // "f32[4, s0, 32]"

// Where the step computes: the CPU when every value is on the CPU; the one CUDA device every non-CPU value lives
// on (host inputs such as the optimizer's [G, 3] hyper-parameter rows stay on the CPU: generated kernels get
// them as scalars, and groups touching other CPU values are not lowered); nullopt for values on two GPUs.
std::optional<Device> compute_device(const Graph& g);

}  // namespace ingot::compiler
