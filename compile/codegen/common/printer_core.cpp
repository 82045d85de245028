// The printer core of the code generators (see printer_core.h).
#include "compile/codegen/common/printer_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "compile/codegen/common/scalar_math.h"
#include "runtime/error.h"

namespace ingot::codegen {

std::string sym_str(const SymInt& s) { return s.is_constant() ? std::to_string(s.value) : numbered("s", s.sym); }

bool is_const(const SymInt& s, int64_t v) { return s.is_constant() && s.value == v; }

KernelSpec coalesce_pointwise(KernelSpec k) {
  if (k.kind != KernelKind::Pointwise) return k;
  for (const Node& n : k.nodes)
    if (n.op == Op::Index) return k;
  for (const SymInt& d : k.dims)
    if (!d.is_constant()) return k;
  for (const Buffer& b : k.buffers)
    for (const SymInt& s : b.strides)
      if (!s.is_constant()) return k;
  for (size_t d = 0; d < k.dims.size();) {  // drop size-1 dims
    if (k.dims[d].value == 1 && k.dims.size() > 1) {
      k.dims.erase(k.dims.begin() + static_cast<std::ptrdiff_t>(d));
      for (Buffer& b : k.buffers) b.strides.erase(b.strides.begin() + static_cast<std::ptrdiff_t>(d));
    } else {
      ++d;
    }
  }
  for (size_t d = 0; d + 1 < k.dims.size();) {
    bool mergeable = true;
    for (const Buffer& b : k.buffers)
      mergeable = mergeable && b.strides[d].value == b.strides[d + 1].value * k.dims[d + 1].value;
    if (!mergeable) {
      ++d;
      continue;
    }
    k.dims[d + 1].value *= k.dims[d].value;
    k.dims.erase(k.dims.begin() + static_cast<std::ptrdiff_t>(d));
    for (Buffer& b : k.buffers) b.strides.erase(b.strides.begin() + static_cast<std::ptrdiff_t>(d));
  }
  return k;
}

void PrinterCore::open(const std::string& s) {
  line(s);
  ++indent_;
}

void PrinterCore::close(const std::string& s) {
  --indent_;
  line(s);
}

std::string PrinterCore::literal(double v, DType t) const {
  if (t == DType::b8) return v != 0 ? "true" : "false";
  if (!is_floating(t)) return int_literal(static_cast<int64_t>(v));
  const bool f = std::string(compute_type(t)) == "float";
  // The value in the compute type, rounded once (to nearest even) as the eager kernels' static_cast<float> of a
  // scalar, then written exactly as a hex float. A 17-digit decimal with an f suffix is rounded a second time by
  // the compiler, decimal to float: 1 + 2^-24 became 1 + 2^-23, not 1.
  const double w = f ? static_cast<double>(static_cast<float>(v)) : v;
  if (std::isnan(w)) return nan_literal(f);
  if (std::isinf(w)) return std::string(w < 0 ? "-" : "") + inf_literal(f);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%a", w);
  return float_literal(buf, f);
}

std::string PrinterCore::as(int id, DType t) const {
  const DType from = k_.nodes[static_cast<size_t>(id)].dtype;
  if (std::string(compute_type(from)) == compute_type(t)) return v(id);
  if (t == DType::b8) return std::string("(").append(v(id)).append(" != 0)");
  return cast(compute_type(t), v(id));
}

void PrinterCore::header_comment() {
  static const char* kinds[] = {"pointwise", "row reduction", "multi-tensor"};
  std::string dims;
  for (const SymInt& d : k_.dims) dims += (dims.empty() ? "" : ", ") + sym_str(d);
  line("// " + (k_.name.empty() ? std::string("kernel") : k_.name) + ": " + kinds[static_cast<int>(k_.kind)] +
       (k_.kind == KernelKind::MultiTensor ? "" : " over [" + dims + "]") + header_suffix());
  for (size_t i = 0; i < k_.buffers.size(); ++i) {
    const Buffer& buf = k_.buffers[i];
    std::string st;
    for (const SymInt& s : buf.strides) st += (st.empty() ? "" : ", ") + sym_str(s);
    line("//   b" + std::to_string(i) + (buf.is_output ? " out " : " in  ") + std::string(dtype_name(buf.dtype)) +
         (k_.kind == KernelKind::MultiTensor ? "" : " strides [" + st + "]") +
         (buf.alias_of >= 0 ? " (in place on b" + std::to_string(buf.alias_of) + ")" : "") +
         (buf.name.empty() ? "" : "  " + buf.name));
  }
}

void PrinterCore::classify() {
  const size_t n = k_.nodes.size();
  element_ = element_level_nodes(k_);
  invariant_.assign(n, false);
  level_.assign(n, 0);
  used_.assign(k_.buffers.size(), false);
  for (const Store& s : k_.stores) used_[static_cast<size_t>(s.buffer)] = true;
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = k_.nodes[i];
    if (nd.op == Op::Load) used_[static_cast<size_t>(nd.arg)] = true;
    if (nd.op == Op::Const || nd.op == Op::Scalar) {
      invariant_[i] = true;
      continue;
    }
    if (nd.op == Op::Load || nd.op == Op::Index) continue;
    bool inv = !is_reduction(nd.op) && nd.op != Op::ColumnSum;
    int lvl = 0;
    for (int o : {nd.a, nd.b, nd.c}) {
      if (o < 0) continue;
      inv = inv && invariant_[static_cast<size_t>(o)];
      lvl = std::max(lvl, level_[static_cast<size_t>(o)]);
    }
    invariant_[i] = inv;
    level_[i] = is_reduction(nd.op) ? lvl + 1 : lvl;
  }
}

RowPhases PrinterCore::plan_rows() const {
  RowPhases rp;
  int max_level = 0;
  for (int l : level_) max_level = std::max(max_level, l);
  rp.phases.resize(static_cast<size_t>(max_level) + 1);
  for (size_t i = 0; i < k_.nodes.size(); ++i) {
    const Node& n = k_.nodes[i];
    RowPhases::Phase& ph = rp.phases[static_cast<size_t>(level_[i])];
    if (is_reduction(n.op)) {
      rp.reductions.push_back(static_cast<int>(i));
      ph.reductions.push_back(static_cast<int>(i));
    } else if (!invariant_[i] && !element_[i] && n.op != Op::ColumnSum) {
      ph.row_nodes.push_back(static_cast<int>(i));
    }
  }
  for (RowPhases::Phase& ph : rp.phases) {
    std::vector<int> operands;
    for (int r : ph.reductions) operands.push_back(k_.nodes[static_cast<size_t>(r)].a);
    if (!operands.empty()) ph.closure = element_closure(operands);
  }
  const size_t last = k_.dims.size() - 1;
  std::vector<int> roots;
  for (const Store& s : k_.stores) {
    if (k_.nodes[static_cast<size_t>(s.node)].op == Op::ColumnSum) {
      rp.column_sums.push_back(s);
    } else if (is_const(k_.buffers[static_cast<size_t>(s.buffer)].strides[last], 0)) {
      rp.row_stores.push_back(s);
    } else {
      rp.element_stores.push_back(s);
      roots.push_back(s.node);
    }
  }
  for (const Store& s : rp.column_sums) roots.push_back(k_.nodes[static_cast<size_t>(s.node)].a);
  rp.epilogue = element_closure(roots);
  return rp;
}

void PrinterCore::declare_buffers(const std::function<std::string(int)>& src, bool used_only) {
  std::vector<bool> aliased(k_.buffers.size(), false);
  for (size_t i = 0; i < k_.buffers.size(); ++i)
    if (k_.buffers[i].alias_of >= 0) aliased[i] = aliased[static_cast<size_t>(k_.buffers[i].alias_of)] = true;
  for (size_t i = 0; i < k_.buffers.size(); ++i) {
    if (used_only && !used_[i]) continue;
    const Buffer& buf = k_.buffers[i];
    const std::string ty = std::string(buf.is_output ? "" : "const ") + storage_type(buf.dtype) + "*";
    // In-place pairs read and write the same element at the same point: no restrict, but the loops still
    // vectorize (each lane loads its element before storing it).
    line(ty + (aliased[i] ? " " : " __restrict__ ") + "b" + std::to_string(i) + " = " +
         cast(ty, src(static_cast<int>(i))) + ";");
  }
}

std::string PrinterCore::load_expr(int buf) const {
  const std::string x = access(buf);
  switch (k_.buffers[static_cast<size_t>(buf)].dtype) {
    case DType::bf16: return "ig_ld_bf16(" + x + ")";
    case DType::f16: return "ig_ld_f16(" + x + ")";
    case DType::b8: return "(" + x + " != 0)";
    case DType::i32: return cast(compute_type(DType::i64), x);
    default: return x;
  }
}

std::string PrinterCore::store_stmt(int buf, int node) const {
  const DType t = k_.buffers[static_cast<size_t>(buf)].dtype;
  const std::string val = as(node, t);
  std::string rhs;
  switch (t) {
    case DType::bf16: rhs = "ig_st_bf16(" + val + ")"; break;
    case DType::f16: rhs = "ig_st_f16(" + val + ")"; break;
    default: rhs = cast(storage_type(t), val); break;
  }
  return access(buf) + " = " + rhs + ";";
}

std::string PrinterCore::unary_expr(const Node& n) const {
  return unary_math(n, as(n.a, n.dtype), compute_type(n.dtype));
}

std::string PrinterCore::unary_math(const Node& n, const std::string& a, const std::string& T) const {
  const DType t = n.dtype;
  switch (n.op) {
    case Op::Neg: return "-" + a;
    case Op::Abs: return is_floating(t) ? math("fabs", T) + "(" + a + ")" : "(" + a + " < 0 ? -" + a + " : " + a + ")";
    case Op::Exp: return math("exp", T) + "(" + a + ")";
    case Op::Log: return math("log", T) + "(" + a + ")";
    case Op::Log1p: return math("log1p", T) + "(" + a + ")";
    case Op::Expm1: return math("expm1", T) + "(" + a + ")";
    case Op::Sqrt: return math("sqrt", T) + "(" + a + ")";
    case Op::Rsqrt: return one(T) + " / " + math("sqrt", T) + "(" + a + ")";
    case Op::Reciprocal: return one(T) + " / " + a;
    case Op::Square: return a + " * " + a;
    case Op::Sin: return math("sin", T) + "(" + a + ")";
    case Op::Cos: return math("cos", T) + "(" + a + ")";
    case Op::Tanh: return math("tanh", T) + "(" + a + ")";
    case Op::Erf: return math("erf", T) + "(" + a + ")";
    case Op::Sigmoid:
    case Op::Relu:
    case Op::GeluTanh:
    case Op::GeluErf:
    case Op::Silu: return scalar_math_call(n.op, T, a);
    case Op::Sign: return cast(T, "(" + a + " > 0) - (" + a + " < 0)");
    case Op::Floor: return math("floor", T) + "(" + a + ")";
    case Op::Not: return "!" + as(n.a, DType::b8);
    case Op::Cast:
      // Narrowing to bf16/f16 rounds (the eager round trip); everything else is a C++ conversion.
      if (t == DType::bf16) return "ig_round_bf16(" + as(n.a, DType::f32) + ")";
      if (t == DType::f16) return "ig_round_f16(" + as(n.a, DType::f32) + ")";
      return a;
    default: break;
  }
  INGOT_INTERNAL_CHECK(false, "codegen: unary op ", op_name(n.op));
  return {};
}

std::string PrinterCore::binary_expr(const Node& n) const {
  DType t = n.dtype;
  if (is_comparison(n.op)) t = promote(k_.nodes[static_cast<size_t>(n.a)].dtype, k_.nodes[static_cast<size_t>(n.b)].dtype);
  if (n.op == Op::And || n.op == Op::Or) t = DType::b8;
  const std::string x = as(n.a, t), y = as(n.b, t), T = compute_type(n.dtype);
  switch (n.op) {
    case Op::Add: return x + " + " + y;
    case Op::Sub: return x + " - " + y;
    case Op::Mul: return mul_expr(T, x, y);
    case Op::Div: return x + " / " + y;
    case Op::Pow: return pow_expr(n, x, y);
    case Op::Max: return max_expr(x, y);
    case Op::Min: return min_expr(x, y);
    case Op::Eq: return x + " == " + y;
    case Op::Ne: return x + " != " + y;
    case Op::Lt: return x + " < " + y;
    case Op::Le: return x + " <= " + y;
    case Op::Gt: return x + " > " + y;
    case Op::Ge: return x + " >= " + y;
    case Op::And: return x + " && " + y;
    case Op::Or: return x + " || " + y;
    case Op::ReluGrad:
    case Op::SigmoidGrad:
    case Op::TanhGrad:
    case Op::SiluGrad:
    case Op::GeluTanhGrad:
    case Op::GeluErfGrad: return scalar_math_call(n.op, T, x + ", " + y);
    // The salt stays an integer (Note [Stochastic rounding], runtime/kernels/scalar_math.h).
    case Op::RoundBf16Stochastic:
      return "ig_math::round_bf16_stochastic(" + as(n.a, DType::f32) + ", " + as(n.b, DType::i64) + ")";
    default: break;
  }
  INGOT_INTERNAL_CHECK(false, "codegen: binary op ", op_name(n.op));
  return {};
}

void PrinterCore::emit_node(int id) {
  const Node& n = k_.nodes[static_cast<size_t>(id)];
  const std::string T = compute_type(n.dtype);
  std::string rhs;
  switch (n.op) {
    case Op::Load: rhs = load_expr(n.arg); break;
    case Op::Const: rhs = literal(n.value, n.dtype); break;
    case Op::Scalar: rhs = scalar_expr(n); break;
    case Op::Index: rhs = index_expr(n); break;
    case Op::Where: rhs = as(n.a, DType::b8) + " ? " + as(n.b, n.dtype) + " : " + as(n.c, n.dtype); break;
    default: rhs = is_binary(n.op) ? binary_expr(n) : unary_expr(n); break;
  }
  line("const " + T + " " + v(id) + " = " + rhs + ";");
}

std::vector<int> PrinterCore::element_closure(const std::vector<int>& roots) const {
  std::vector<bool> need(k_.nodes.size(), false);
  for (int r : roots) need[static_cast<size_t>(r)] = true;
  for (size_t i = k_.nodes.size(); i-- > 0;) {
    if (!need[i] || !element_[i] || is_reduction(k_.nodes[i].op)) continue;  // (ColumnSum is not element level)
    for (int o : {k_.nodes[i].a, k_.nodes[i].b, k_.nodes[i].c})
      if (o >= 0) need[static_cast<size_t>(o)] = true;
  }
  std::vector<int> out;
  for (size_t i = 0; i < k_.nodes.size(); ++i)
    if (need[i] && element_[i] && !invariant_[i] && !is_reduction(k_.nodes[i].op)) out.push_back(static_cast<int>(i));
  return out;
}

}  // namespace ingot::codegen
