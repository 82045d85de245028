#include "compile/lower/lower_kernel.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "autograd/kernel_lowering.h"
#include "autograd/ops/attrs.h"
#include "autograd/primitive_multi_tensor.h"

namespace ingot::compiler {
namespace {

using codegen::KernelKind;
using codegen::KernelSpec;
using codegen::Op;
using codegen::SymInt;

// An iteration dim is a run [lo, hi] of adjacent axes of the group's natural (row-major) shape, merged; a
// row reduction's reduced run comes last, so a reduction over leading axes (a bias gradient) reads its input
// through strides, transposed, with no copy.
struct Run {
  int64_t lo, hi;
};

class Lowerer final : public LowerContext {
 public:
  Lowerer(const Graph& g, LoweredGroup& out, Shape natural, std::vector<Run> runs)
      : g_(g), out_(out), natural_(std::move(natural)), runs_(std::move(runs)) {
    for (const Run& r : runs_) {
      int64_t n = 1;
      for (int64_t a = r.lo; a <= r.hi; ++a) n *= natural_[static_cast<size_t>(a)];
      dims_.push_back(n);
      out_.spec.dims.push_back(SymInt::constant(n));
    }
  }

  // Strides over the iteration dims of a dense tensor of shape s (right-aligned to the natural shape;
  // size-1 and missing axes broadcast).
  std::vector<SymInt> strides_for(const Shape& s) const {
    const size_t rank = natural_.size();
    if (s.size() > rank) throw Unsupported("an input of higher rank than the kernel");
    const size_t lead = rank - s.size();
    const Strides cs = contiguous_strides(s);
    std::vector<SymInt> st;
    for (const Run& r : runs_) {
      int bcast = 0, full = 0;
      for (int64_t a = r.lo; a <= r.hi; ++a) {
        const int64_t nat = natural_[static_cast<size_t>(a)];
        const bool missing = static_cast<size_t>(a) < lead;
        const int64_t sz = missing ? 1 : s[static_cast<size_t>(a) - lead];
        if (sz == nat && nat != 1) ++full;
        else if (sz == 1) ++bcast;
        else throw Unsupported("an input that does not broadcast to the kernel's shape");
      }
      if (full > 0 && bcast > 0) {
        // Mixed within a merged run is fine only when the broadcast axes have natural size 1.
        for (int64_t a = r.lo; a <= r.hi; ++a) {
          const bool missing = static_cast<size_t>(a) < lead;
          const int64_t sz = missing ? 1 : s[static_cast<size_t>(a) - lead];
          if (sz == 1 && natural_[static_cast<size_t>(a)] != 1) throw Unsupported("a partly broadcast merged dim");
        }
      }
      const bool hi_missing = static_cast<size_t>(r.hi) < lead;
      st.push_back(SymInt::constant(full == 0 || hi_missing ? 0 : cs[static_cast<size_t>(r.hi) - lead]));
    }
    return st;
  }

  // Node id of value v inside the kernel (a load of a new input buffer for values from outside).
  int value(int32_t v) {
    if (auto it = ids_.find(v); it != ids_.end()) return it->second;
    const Value& val = g_.values[static_cast<size_t>(v)];
    const int buf = out_.spec.input(val.dtype, strides_for(trace_shape(val.shape)), detail::str_cat("v", v));
    out_.inputs.push_back(v);
    loaded_.insert(v);
    return ids_[v] = out_.spec.load(buf);
  }

  // A per-row value from outside (a norm's mean or rstd: the natural shape without its last axis), read as if
  // it had a trailing size-1 axis; right-aligned broadcasting would line it up with the wrong axes.
  int row_value(int32_t v) {
    if (auto it = ids_.find(v); it != ids_.end() && !loaded_.count(v)) return it->second;
    if (auto it = row_ids_.find(v); it != row_ids_.end()) return it->second;
    const Value& val = g_.values[static_cast<size_t>(v)];
    Shape s = trace_shape(val.shape);
    if (natural_.empty() || s != Shape(natural_.begin(), natural_.end() - 1))
      throw Unsupported("a per-row input whose shape is not the kernel's rows");
    s.push_back(1);
    const int buf = out_.spec.input(val.dtype, strides_for(s), detail::str_cat("v", v));
    out_.inputs.push_back(v);
    return row_ids_[v] = out_.spec.load(buf);
  }

  // The op lowers itself (Note [Ops lower themselves], autograd/kernel_lowering.h).
  void node(const Node& n) {
    const KernelLowering* l = as_kernel_lowering(*n.prim);
    if (!l) throw Unsupported("op '" + std::string(n.prim->name()) + "' has no kernel lowering");
    node_ = &n;
    set_outputs(n, l->lower(*this));
    node_ = nullptr;
  }

  // LowerContext, for the node being lowered.
  KernelSpec& spec() override { return out_.spec; }
  int input(size_t i) override { return value(node_->inputs.at(i)); }
  bool has_input(size_t i) const override { return i < node_->inputs.size() && node_->inputs[i] >= 0; }
  int row_input(size_t i) override { return row_value(node_->inputs.at(i)); }
  DType output_dtype(size_t i) const override { return g_.values[static_cast<size_t>(node_->outputs.at(i))].dtype; }
  bool row_reduction() const override { return out_.spec.kind == KernelKind::RowReduction; }
  int64_t reduced_size() const override { return dims_.back(); }
  [[noreturn]] void unsupported(const std::string& why) override { throw Unsupported{why}; }

  void set_outputs(const Node& n, std::vector<int> rs) {
    KernelSpec& k = out_.spec;
    if (rs.size() != n.outputs.size()) throw Unsupported("an op with an unexpected number of outputs");
    for (size_t i = 0; i < rs.size(); ++i) {
      const DType want = g_.values[static_cast<size_t>(n.outputs[i])].dtype;
      // A column sum is only ever stored (the store rounds it to the buffer's dtype).
      if (k.nodes[static_cast<size_t>(rs[i])].dtype != want && k.nodes[static_cast<size_t>(rs[i])].op != Op::ColumnSum)
        rs[i] = k.cast(rs[i], want);
      ids_[n.outputs[i]] = rs[i];
    }
  }

  // An output: element level (the natural shape), row level (the natural shape without the reduced axes, with
  // or without kept size-1 dims) or a column sum's (the reduced axes alone), laid out densely.
  void store(int32_t v) {
    const Value& val = g_.values[static_cast<size_t>(v)];
    Shape s = trace_shape(val.shape);
    if (out_.spec.nodes[static_cast<size_t>(ids_.at(v))].op == Op::ColumnSum) {
      // A column output: the reduced (last) run of the natural shape, every row dim broadcast.
      if (s != Shape(natural_.begin() + runs_.back().lo, natural_.end()))
        throw Unsupported("a column sum of an unexpected shape");
    } else {
      row_or_element_shape(s);
    }
    const int buf = out_.spec.output(val.dtype, strides_for(s), detail::str_cat("v", v));
    out_.spec.store(buf, ids_.at(v));
    out_.outputs.push_back(v);
  }

  // An element output's shape is the natural one; a row output's (with or without kept size-1 dims) becomes
  // the natural shape with size 1 on the reduced axes.
  void row_or_element_shape(Shape& s) const {
    if (s != natural_ && out_.spec.kind == KernelKind::RowReduction) {
      const Run& red = runs_.back();
      Shape full = natural_;
      for (int64_t a = red.lo; a <= red.hi; ++a) full[static_cast<size_t>(a)] = 1;
      Shape dropped;
      for (size_t a = 0; a < natural_.size(); ++a)
        if (static_cast<int64_t>(a) < red.lo || static_cast<int64_t>(a) > red.hi) dropped.push_back(natural_[a]);
      if (s == full || s == dropped) s = full;
    }
    if (s.size() != natural_.size()) throw Unsupported("an output whose shape differs from the kernel's");
    for (size_t a = 0; a < s.size(); ++a)
      if (s[a] != natural_[a] && s[a] != 1) throw Unsupported("an output whose shape differs from the kernel's");
  }

  struct Unsupported {
    std::string why;
  };

 private:
  const Graph& g_;
  LoweredGroup& out_;
  Shape natural_;
  std::vector<Run> runs_;
  Shape dims_;
  std::map<int32_t, int> ids_;
  std::set<int32_t> loaded_;         // values read from outside through value()
  std::map<int32_t, int> row_ids_;   // values read from outside through row_value()
  const Node* node_ = nullptr;       // the node lower() is building
};

// A multi-tensor update lowers itself (Note [Multi-tensor updates], autograd/primitive_multi_tensor.h).
std::optional<LoweredGroup> lower_update(const Graph& g, const FusionGroup& fg, std::string* why) {
  if (fg.nodes.size() != 1) {
    if (why) *why = "more than one optimizer update in the group";
    return std::nullopt;
  }
  const Node& n = g.nodes[static_cast<size_t>(fg.nodes[0])];
  const MultiTensorUpdate* update = as_multi_tensor_update(*n.prim);
  if (!update) {
    if (why) *why = "op '" + std::string(n.prim->name()) + "' has no kernel lowering";
    return std::nullopt;
  }
  std::vector<DType> dtypes;
  for (int32_t v : n.inputs) dtypes.push_back(g.values[static_cast<size_t>(v)].dtype);
  std::optional<MultiTensorKernel> mk = update->lower(dtypes, why);
  if (!mk) return std::nullopt;
  LoweredGroup lg;
  lg.spec = std::move(mk->spec);
  lg.inputs = n.inputs;
  lg.outputs = n.outputs;
  lg.hyper_value = n.inputs[0];
  lg.hyper_row = mk->hyper_row;
  lg.beta1 = mk->beta1;
  lg.beta2 = mk->beta2;
  lg.weight_decay = mk->weight_decay;
  lg.tensors = update->tensors();
  lg.state_slots = update->state_slots();
  return lg;
}

// Note [Parameter casts] (compile/passes/fuse.cpp): one cast over every tensor of the group; slot 0 reads the f32
// parameter, slot 1 writes its bf16 / f16 copy.
std::optional<LoweredGroup> lower_parameter_casts(const Graph& g, const FusionGroup& fg, std::string* why) {
  LoweredGroup lg;
  KernelSpec& k = lg.spec;
  k.kind = KernelKind::MultiTensor;
  k.name = "cast_params";
  const DType to = g.values[static_cast<size_t>(g.nodes[static_cast<size_t>(fg.nodes[0])].outputs[0])].dtype;
  for (int32_t n : fg.nodes) {
    const Node& node = g.nodes[static_cast<size_t>(n)];
    if (!match<CastAttrs>(*node.prim) || g.values[static_cast<size_t>(node.outputs[0])].dtype != to ||
        g.values[static_cast<size_t>(node.inputs[0])].dtype != DType::f32) {
      if (why) *why = "a multi-tensor group of casts with mixed dtypes";
      return std::nullopt;
    }
    lg.inputs.push_back(node.inputs[0]);
    lg.outputs.push_back(node.outputs[0]);
  }
  const int src = k.input(DType::f32, {}, "param"), dst = k.output(to, {}, "cast");
  k.store(dst, k.cast(k.load(src), to));
  lg.tensors = fg.nodes.size();
  return lg;
}

}  // namespace

std::optional<LoweredGroup> lower_group(const Graph& g, const FusionGroup& fg, std::string* why) {
  if (fg.kind == GroupKind::MultiTensor && match<CastAttrs>(*g.nodes[static_cast<size_t>(fg.nodes[0])].prim))
    return lower_parameter_casts(g, fg, why);
  if (fg.kind == GroupKind::MultiTensor) return lower_update(g, fg, why);
  LoweredGroup lg;
  lg.spec.kind = fg.kind == GroupKind::RowReduction ? KernelKind::RowReduction : KernelKind::Pointwise;
  lg.spec.name = fg.name;
  // The natural shape: the pointwise outputs' shape, or the reduction's (row-major) input shape; a
  // reduction's reduced axes must be one adjacent run (merged into the last iteration dim).
  Shape natural;
  std::vector<int64_t> reduced;
  for (int32_t n : fg.nodes) {
    const Node& node = g.nodes[static_cast<size_t>(n)];
    const KernelLowering* l = as_kernel_lowering(*node.prim);
    if (!l && node.prim->fusion_kind() == FusionKind::Reduction) {
      if (why) *why = "op '" + std::string(node.prim->name()) + "' has no kernel lowering";
      return std::nullopt;
    }
    const Shape in0 = node.inputs.empty() ? Shape{} : trace_shape(g.values[static_cast<size_t>(node.inputs[0])].shape);
    std::string reason;
    if (std::optional<std::vector<int64_t>> axes = l ? l->reduced_axes(in0, &reason) : std::nullopt) {
      natural = in0;
      reduced = std::move(*axes);
      if (reduced.empty()) {
        if (why) *why = reason.empty() ? "a scalar or empty iteration space" : reason;
        return std::nullopt;
      }
      break;
    }
    if (natural.empty() && !node.outputs.empty()) natural = trace_shape(g.values[static_cast<size_t>(node.outputs[0])].shape);
  }
  if (natural.empty() || numel(natural) == 0) {
    if (why) *why = "a scalar or empty iteration space";
    return std::nullopt;
  }
  std::vector<Run> runs;
  if (reduced.empty()) {
    for (int64_t a = 0; a < static_cast<int64_t>(natural.size()); ++a) runs.push_back(Run{a, a});
  } else {
    for (size_t i = 1; i < reduced.size(); ++i)
      if (reduced[i] != reduced[i - 1] + 1) {
        if (why) *why = "a reduction over non-adjacent dims";
        return std::nullopt;
      }
    for (int64_t a = 0; a < static_cast<int64_t>(natural.size()); ++a)
      if (a < reduced.front() || a > reduced.back()) runs.push_back(Run{a, a});
    runs.push_back(Run{reduced.front(), reduced.back()});
  }
  try {
    Lowerer lw(g, lg, natural, runs);
    for (int32_t n : fg.nodes) lw.node(g.nodes[static_cast<size_t>(n)]);
    for (int32_t v : fg.outputs) lw.store(v);
    lg.spec.validate();
  } catch (const Lowerer::Unsupported& u) {
    if (why) *why = u.why;
    return std::nullopt;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
  return lg;
}

}  // namespace ingot::compiler
