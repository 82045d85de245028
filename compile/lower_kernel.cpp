#include "compile/lower_kernel.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "autograd/kernel_lowering.h"
#include "autograd/ops/attrs.h"
#include "autograd/ops/norm.h"
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
    if (!l) return legacy_node(n);
    node_ = &n;
    set_outputs(n, l->lower(*this));
    node_ = nullptr;
  }

  // The families that do not lower themselves yet.
  void legacy_node(const Node& n) {
    KernelSpec& k = out_.spec;
    const std::string_view name = n.prim->name();
    auto in = [&](size_t i) { return value(n.inputs.at(i)); };
    auto floating = [&](int x) {
      const DType t = k.nodes[static_cast<size_t>(x)].dtype;
      return is_floating(t) ? x : k.cast(x, DType::f32);
    };
    int r = -1;
    if (name == "softmax" || name == "log_softmax") {
      if (out_.spec.kind != KernelKind::RowReduction) throw Unsupported("a reduction in a pointwise kernel");
      const int x = floating(in(0));
      const int m = k.reduce(Op::ReduceMax, x);
      const int sh = k.binary(Op::Sub, x, m);
      const int e = k.unary(Op::Exp, sh);
      const int s = k.reduce(Op::ReduceSum, e);
      r = name == "softmax" ? k.binary(Op::Div, e, s) : k.binary(Op::Sub, sh, k.unary(Op::Log, s));
      r = k.cast(r, g_.values[static_cast<size_t>(n.outputs[0])].dtype);
    } else if (name == "softmax_bwd" || name == "log_softmax_bwd") {  // inputs: dy, y
      if (out_.spec.kind != KernelKind::RowReduction) throw Unsupported("a reduction in a pointwise kernel");
      const int dy = floating(in(0)), y = floating(in(1));
      if (name == "softmax_bwd") {
        const int s = k.reduce(Op::ReduceSum, k.binary(Op::Mul, dy, y));
        r = k.binary(Op::Mul, y, k.binary(Op::Sub, dy, s));
      } else {
        const int s = k.reduce(Op::ReduceSum, dy);
        r = k.binary(Op::Sub, dy, k.binary(Op::Mul, k.unary(Op::Exp, y), s));
      }
      r = k.cast(r, g_.values[static_cast<size_t>(n.outputs[0])].dtype);
    } else if (const NormAttrs* norm = match<NormAttrs>(*n.prim)) {  // layer_norm, rms_norm
      if (out_.spec.kind != KernelKind::RowReduction) throw Unsupported("a reduction in a pointwise kernel");
      const bool centered = norm->centered;
      const double eps = norm->eps;
      const int x0 = in(0);
      const DType st = k.nodes[static_cast<size_t>(x0)].dtype == DType::f64 ? DType::f64 : DType::f32;
      const int x = k.cast(x0, st);
      const int cols = k.constant(static_cast<double>(dims_.back()), st);
      int d = x, mu = -1;
      if (centered) {
        mu = k.binary(Op::Div, k.reduce(Op::ReduceSum, x), cols);
        d = k.binary(Op::Sub, x, mu);
      }
      const int var = k.binary(Op::Div, k.reduce(Op::ReduceSum, k.binary(Op::Mul, d, d)), cols);
      const int rstd = k.unary(Op::Rsqrt, k.binary(Op::Add, var, k.constant(eps, st)));
      int y = k.binary(Op::Mul, d, rstd);
      if (n.inputs.size() > 1 && n.inputs[1] >= 0) y = k.binary(Op::Mul, y, k.cast(in(1), st));
      if (centered && n.inputs.size() > 2 && n.inputs[2] >= 0) y = k.binary(Op::Add, y, k.cast(in(2), st));
      std::vector<int> rs{y};
      if (centered) rs.push_back(mu);
      rs.push_back(rstd);
      set_outputs(n, rs);
      return;
    } else if (const std::optional<NormBwdFlags> f = norm_bwd_flags(*n.prim)) {
      // inputs: dy, x, mean (none for rms_norm), rstd, w (or none); the math of norm_bwd_impl
      // (runtime/kernels/cpu/norm.cpp) in its precision, f32 (f64 for f64 x).
      if (out_.spec.kind != KernelKind::RowReduction) throw Unsupported("a reduction in a pointwise kernel");
      const DType st = k.nodes[static_cast<size_t>(in(1))].dtype == DType::f64 ? DType::f64 : DType::f32;
      auto as = [&](int x) { return k.nodes[static_cast<size_t>(x)].dtype == st ? x : k.cast(x, st); };
      const int dy = as(in(0)), rstd = as(row_value(n.inputs.at(3)));
      const int centered_x = f->centered ? k.binary(Op::Sub, as(in(1)), as(row_value(n.inputs.at(2)))) : as(in(1));
      const int xhat = k.binary(Op::Mul, centered_x, rstd);
      std::vector<int> rs;
      if (f->dx) {
        const int gw = n.inputs.at(4) >= 0 ? k.binary(Op::Mul, dy, as(in(4))) : dy;
        const int inv_c = k.constant(1.0 / static_cast<double>(dims_.back()), st);
        int d = gw;
        if (f->centered) d = k.binary(Op::Sub, gw, k.binary(Op::Mul, k.reduce(Op::ReduceSum, gw), inv_c));
        const int mean_gx = k.binary(Op::Mul, k.reduce(Op::ReduceSum, k.binary(Op::Mul, gw, xhat)), inv_c);
        rs.push_back(k.binary(Op::Mul, rstd, k.binary(Op::Sub, d, k.binary(Op::Mul, xhat, mean_gx))));
        // dw, db from the same values (Note [Column sums in row reductions], render_cuda.cpp).
        if (f->dw) rs.push_back(k.column_sum(k.binary(Op::Mul, dy, xhat)));
        if (f->db) rs.push_back(k.column_sum(dy));
      } else {  // the reduced dim is every row (lower_group transposes the iteration space)
        if (f->dw) rs.push_back(k.reduce(Op::ReduceSum, k.binary(Op::Mul, dy, xhat)));
        if (f->db) rs.push_back(k.reduce(Op::ReduceSum, dy));
      }
      set_outputs(n, rs);
      return;
    } else {
      throw Unsupported("op '" + std::string(name) + "' has no kernel lowering");
    }
    if (n.outputs.size() != 1) throw Unsupported("a multi-output op");
    set_outputs(n, {r});
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
    if (node.prim->name() != "cast" || g.values[static_cast<size_t>(node.outputs[0])].dtype != to ||
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
  if (fg.kind == GroupKind::MultiTensor && g.nodes[static_cast<size_t>(fg.nodes[0])].prim->name() == "cast")
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
    if (!l && (node.prim->fusion_kind() == FusionKind::Reduction || norm_bwd_flags(*node.prim))) {
      natural = trace_shape(g.values[static_cast<size_t>(node.inputs[0])].shape);
      const std::optional<NormBwdFlags> norm = norm_bwd_flags(*node.prim);
      if (norm && !norm->dx) {
        for (int64_t a = 0; a + 1 < static_cast<int64_t>(natural.size()); ++a) reduced.push_back(a);
        if (reduced.empty()) {
          if (why) *why = "a norm weight gradient over a single row";
          return std::nullopt;
        }
      } else if (!natural.empty()) {
        reduced = {static_cast<int64_t>(natural.size()) - 1};
      }
      break;
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
