#include "compile/lower_kernel.h"

#include <map>
#include <sstream>

#include "compile/lowering.h"
#include "optim/fused_update.h"

namespace ingot::compiler {
namespace {

using codegen::KernelKind;
using codegen::KernelSpec;
using codegen::Op;
using codegen::SymInt;

// The unary primitives whose kernel op is one spec op (names from runtime/kernels/names.cpp).
const std::map<std::string_view, Op>& unary_table() {
  static const std::map<std::string_view, Op> t{
      {"neg", Op::Neg},       {"exp", Op::Exp},         {"log", Op::Log},         {"sqrt", Op::Sqrt},
      {"rsqrt", Op::Rsqrt},   {"abs", Op::Abs},         {"tanh", Op::Tanh},       {"sigmoid", Op::Sigmoid},
      {"relu", Op::Relu},     {"gelu_tanh", Op::GeluTanh}, {"gelu_erf", Op::GeluErf}, {"silu", Op::Silu},
      {"sin", Op::Sin},       {"cos", Op::Cos},         {"reciprocal", Op::Reciprocal}, {"square", Op::Square},
      {"sign", Op::Sign},     {"log1p", Op::Log1p},     {"expm1", Op::Expm1},     {"floor", Op::Floor}};
  return t;
}
const std::map<std::string_view, Op>& binary_table() {
  static const std::map<std::string_view, Op> t{
      {"add", Op::Add}, {"sub", Op::Sub}, {"mul", Op::Mul}, {"div", Op::Div}, {"pow", Op::Pow},
      {"maximum", Op::Max}, {"minimum", Op::Min}, {"eq", Op::Eq}, {"ne", Op::Ne}, {"lt", Op::Lt},
      {"le", Op::Le}, {"gt", Op::Gt}, {"ge", Op::Ge}, {"logical_and", Op::And}, {"logical_or", Op::Or}};
  return t;
}

// The attributes as printed, at full double precision (alpha=... must round-trip exactly).
std::string attrs_of(const Primitive& p) {
  std::ostringstream os;
  os.precision(17);
  p.print_attrs(os);
  return os.str();
}
std::optional<double> alpha_of(const Primitive& p) {
  const std::string a = attrs_of(p);
  if (a.rfind("alpha=", 0) != 0) return std::nullopt;
  return std::stod(a.substr(6));
}

std::vector<SymInt> broadcast_strides(const Shape& s, const Shape& dims) {
  std::vector<SymInt> st(dims.size(), SymInt::constant(0));
  const Strides cs = contiguous_strides(s);
  const size_t lead = dims.size() - s.size();
  for (size_t d = lead; d < dims.size(); ++d) {
    const size_t j = d - lead;
    st[d] = SymInt::constant(s[j] == 1 && dims[d] != 1 ? 0 : cs[j]);
  }
  return st;
}

class Lowerer {
 public:
  Lowerer(const Graph& g, LoweredGroup& out, Shape dims) : g_(g), out_(out), dims_(std::move(dims)) {
    for (int64_t d : dims_) out_.spec.dims.push_back(SymInt::constant(d));
  }

  // Node id of value v inside the kernel (a load of a new input buffer for values from outside).
  int value(int32_t v) {
    if (auto it = ids_.find(v); it != ids_.end()) return it->second;
    const Value& val = g_.values[static_cast<size_t>(v)];
    const Shape s = trace_shape(val.shape);
    if (s.size() > dims_.size()) throw Unsupported("an input of higher rank than the kernel");
    for (size_t j = 0; j < s.size(); ++j) {
      const int64_t d = dims_[dims_.size() - s.size() + j];
      if (s[j] != d && s[j] != 1) throw Unsupported("an input that does not broadcast to the kernel's shape");
    }
    const int buf = out_.spec.input(val.dtype, broadcast_strides(s, dims_), "v" + std::to_string(v));
    out_.inputs.push_back(v);
    return ids_[v] = out_.spec.load(buf);
  }

  void node(const Node& n) {
    KernelSpec& k = out_.spec;
    const std::string_view name = n.prim->name();
    auto in = [&](size_t i) { return value(n.inputs.at(i)); };
    auto floating = [&](int x) {
      const DType t = k.nodes[static_cast<size_t>(x)].dtype;
      return is_floating(t) ? x : k.cast(x, DType::f32);
    };
    auto c = [&](double v, int like) { return k.constant(v, k.nodes[static_cast<size_t>(like)].dtype); };
    int r = -1;
    if (auto u = unary_table().find(name); u != unary_table().end()) {
      r = k.unary(u->second, floating(in(0)));
    } else if (name == "pow_scalar" || name == "add_scalar" || name == "mul_scalar" || name == "rsub_scalar" ||
               name == "rdiv_scalar") {
      const int x = floating(in(0));
      const double a = alpha_of(*n.prim).value_or(0.0);
      if (name == "pow_scalar") r = k.binary(Op::Pow, x, c(a, x));
      else if (name == "add_scalar") r = k.binary(Op::Add, x, c(a, x));
      else if (name == "mul_scalar") r = k.binary(Op::Mul, x, c(a, x));
      else if (name == "rsub_scalar") r = k.binary(Op::Sub, c(a, x), x);
      else r = k.binary(Op::Div, c(a, x), x);
    } else if (auto b = binary_table().find(name); b != binary_table().end()) {
      r = k.binary(b->second, in(0), in(1));
    } else if (name == "gelu_tanh_grad") {  // y * gelu_tanh'(x), as runtime/kernels/cpu/elementwise.cpp
      const int x = in(0), y = in(1);
      const int kk = c(0.7978845608028654, x), cc = c(0.044715, x), half = c(0.5, x), one = c(1, x);
      const int x3 = k.binary(Op::Mul, k.binary(Op::Mul, k.binary(Op::Mul, cc, x), x), x);
      const int t = k.unary(Op::Tanh, k.binary(Op::Mul, kk, k.binary(Op::Add, x, x3)));
      const int a = k.binary(Op::Mul, half, k.binary(Op::Add, one, t));
      const int sech = k.binary(Op::Sub, one, k.binary(Op::Mul, t, t));
      const int poly = k.binary(Op::Add, one, k.binary(Op::Mul, k.binary(Op::Mul, c(3 * 0.044715, x), x), x));
      const int bterm = k.binary(Op::Mul, k.binary(Op::Mul, k.binary(Op::Mul, k.binary(Op::Mul, half, x), sech), kk), poly);
      r = k.binary(Op::Mul, y, k.binary(Op::Add, a, bterm));
    } else if (name == "gelu_erf_grad") {
      const int x = in(0), y = in(1);
      const int cdf = k.binary(Op::Mul, c(0.5, x),
                               k.binary(Op::Add, c(1, x), k.unary(Op::Erf, k.binary(Op::Mul, x, c(0.7071067811865476, x)))));
      const int pdf = k.binary(Op::Mul, k.binary(Op::Mul, x, c(0.3989422804014327, x)),
                               k.unary(Op::Exp, k.binary(Op::Mul, k.binary(Op::Mul, c(-0.5, x), x), x)));
      r = k.binary(Op::Mul, y, k.binary(Op::Add, cdf, pdf));
    } else if (name == "silu_grad") {
      const int x = in(0), y = in(1), one = c(1, x);
      const int s = k.unary(Op::Sigmoid, x);
      r = k.binary(Op::Mul, y, k.binary(Op::Mul, s, k.binary(Op::Add, one, k.binary(Op::Mul, x, k.binary(Op::Sub, one, s)))));
    } else if (name == "sigmoid_grad") {  // x is the sigmoid's output
      const int x = in(0), y = in(1);
      r = k.binary(Op::Mul, k.binary(Op::Mul, y, x), k.binary(Op::Sub, c(1, x), x));
    } else if (name == "tanh_grad") {
      const int x = in(0), y = in(1);
      r = k.binary(Op::Mul, y, k.binary(Op::Sub, c(1, x), k.binary(Op::Mul, x, x)));
    } else if (name == "relu_grad") {
      const int x = in(0), y = in(1);
      r = k.where(k.binary(Op::Gt, x, c(0, x)), y, c(0, y));
    } else if (name == "where") {
      r = k.where(in(0), in(1), in(2));
    } else if (name == "cast") {
      r = k.cast(in(0), g_.values[static_cast<size_t>(n.outputs[0])].dtype);
    } else if (name == "clone" || name == "contiguous") {
      r = in(0);
    } else if (name == "softmax" || name == "log_softmax") {
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
    } else {
      throw Unsupported("op '" + std::string(name) + "' has no kernel lowering");
    }
    if (n.outputs.size() != 1) throw Unsupported("a multi-output op");
    const DType want = g_.values[static_cast<size_t>(n.outputs[0])].dtype;
    if (k.nodes[static_cast<size_t>(r)].dtype != want) r = k.cast(r, want);
    ids_[n.outputs[0]] = r;
  }

  void store(int32_t v) {
    const Value& val = g_.values[static_cast<size_t>(v)];
    if (trace_shape(val.shape) != dims_) throw Unsupported("an output whose shape differs from the kernel's");
    const int buf = out_.spec.output(val.dtype, broadcast_strides(dims_, dims_), "v" + std::to_string(v));
    out_.spec.store(buf, ids_.at(v));
    out_.outputs.push_back(v);
  }

  struct Unsupported {
    std::string why;
  };

 private:
  const Graph& g_;
  LoweredGroup& out_;
  Shape dims_;
  std::map<int32_t, int> ids_;
};

std::optional<LoweredGroup> lower_adamw(const Graph& g, const FusionGroup& fg, std::string* why) {
  if (fg.nodes.size() != 1) {
    if (why) *why = "more than one optimizer update in the group";
    return std::nullopt;
  }
  const Node& n = g.nodes[static_cast<size_t>(fg.nodes[0])];
  kernels::AdamWArgs a;
  size_t count = 0;
  int64_t row = 0;
  if (!optim::adamw_update_args(*n.prim, &a, &count, &row)) {
    if (why) *why = "op '" + std::string(n.prim->name()) + "' has no kernel lowering";
    return std::nullopt;
  }
  LoweredGroup lg;
  KernelSpec& k = lg.spec;
  k.kind = KernelKind::MultiTensor;
  k.name = "adamw_update";
  const DType gt = g.values[static_cast<size_t>(n.inputs[1 + count])].dtype;
  for (size_t t = 0; t < count; ++t)
    if (g.values[static_cast<size_t>(n.inputs[1 + count + t])].dtype != gt) {
      if (why) *why = "gradients of different dtypes";
      return std::nullopt;
    }
  const int p = k.input(DType::f32, {}, "param"), gr = k.input(gt, {}, "grad"), m = k.input(DType::f32, {}, "exp_avg"),
            v = k.input(DType::f32, {}, "exp_avg_sq");
  const int po = k.output(DType::f32, {}, "param_out", p), mo = k.output(DType::f32, {}, "exp_avg_out", m),
            vo = k.output(DType::f32, {}, "exp_avg_sq_out", v);
  // Scalars: 0 lr, 1 decay = 1 - lr * weight_decay, 2 grad scale, 3 bias correction 1, 4 bias correction 2;
  // the float arithmetic of runtime/kernels/cpu/optim.cpp, in its order.
  auto f = [&](double x) { return k.constant(static_cast<double>(static_cast<float>(x)), DType::f32); };
  const float b1 = static_cast<float>(a.beta1), b2 = static_cast<float>(a.beta2);
  const int gj = k.binary(Op::Mul, k.cast(k.load(gr), DType::f32), k.scalar(2, DType::f32));
  const int mj = k.binary(Op::Add, k.binary(Op::Mul, f(b1), k.load(m)), k.binary(Op::Mul, f(1.0f - b1), gj));
  const int vj = k.binary(Op::Add, k.binary(Op::Mul, f(b2), k.load(v)),
                          k.binary(Op::Mul, k.binary(Op::Mul, f(1.0f - b2), gj), gj));
  const int step = k.binary(Op::Div, k.binary(Op::Mul, k.scalar(0, DType::f32), k.binary(Op::Div, mj, k.scalar(3, DType::f32))),
                            k.binary(Op::Add, k.unary(Op::Sqrt, k.binary(Op::Div, vj, k.scalar(4, DType::f32))), f(a.eps)));
  const int pj = k.binary(Op::Sub, k.binary(Op::Mul, k.load(p), k.scalar(1, DType::f32)), step);
  k.store(po, pj);
  k.store(mo, mj);
  k.store(vo, vj);
  lg.inputs = n.inputs;
  lg.outputs = n.outputs;
  lg.hyper_value = n.inputs[0];
  lg.hyper_row = row;
  lg.beta1 = a.beta1;
  lg.beta2 = a.beta2;
  lg.weight_decay = a.weight_decay;
  lg.tensors = count;
  return lg;
}

}  // namespace

std::optional<LoweredGroup> lower_group(const Graph& g, const FusionGroup& fg, std::string* why) {
  if (fg.kind == GroupKind::MultiTensor) return lower_adamw(g, fg, why);
  LoweredGroup lg;
  lg.spec.kind = fg.kind == GroupKind::RowReduction ? KernelKind::RowReduction : KernelKind::Pointwise;
  lg.spec.name = fg.name;
  // The iteration space: the pointwise outputs' shape, or the reduction's (row-major) input shape.
  Shape dims;
  for (int32_t n : fg.nodes) {
    const Node& node = g.nodes[static_cast<size_t>(n)];
    if (node.prim->fusion_kind() == FusionKind::Reduction) {
      dims = trace_shape(g.values[static_cast<size_t>(node.inputs[0])].shape);
      break;
    }
    if (dims.empty() && !node.outputs.empty()) dims = trace_shape(g.values[static_cast<size_t>(node.outputs[0])].shape);
  }
  if (dims.empty() || numel(dims) == 0) {
    if (why) *why = "a scalar or empty iteration space";
    return std::nullopt;
  }
  try {
    Lowerer lw(g, lg, dims);
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
