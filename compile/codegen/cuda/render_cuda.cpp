// CUDA rendering of KernelSpecs (see render_cuda.h for the shape of the generated code): the shared printer of
// render_cuda_core.h and render_kernel(); the kernel kinds are render_cuda_pointwise.cpp and render_cuda_rows.cpp.
#include "compile/codegen/cuda/render_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "compile/codegen/cuda/render_cuda_core.h"
#include "compile/codegen/common/scalar_math.h"
#include "runtime/error.h"

namespace ingot::codegen::cuda {
namespace detail {

const char* storage_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::bf16: case DType::f16: return "unsigned short";
    case DType::i32: return "int";
    case DType::i64: return "long long";
    case DType::b8: return "unsigned char";
  }
  return "?";
}

// The type a value of dtype t is computed in (kernel_spec.h, "Numerics").
const char* compute_type(DType t) {
  switch (t) {
    case DType::f32: case DType::bf16: case DType::f16: return "float";
    case DType::f64: return "double";
    case DType::i32: case DType::i64: return "long long";
    case DType::b8: return "bool";
  }
  return "?";
}

// CUDA's math functions: expf for float, exp for double.
std::string fn(const std::string& name, const std::string& T) { return T == "float" ? name + "f" : name; }

std::string sym_str(const SymInt& s) { return s.is_constant() ? std::to_string(s.value) : "s" + std::to_string(s.sym); }

std::string literal(double v, DType t) {
  if (t == DType::b8) return v != 0 ? "true" : "false";
  if (!is_floating(t)) {
    const int64_t i = static_cast<int64_t>(v);
    if (i == INT64_MIN) return "(-9223372036854775807LL - 1)";
    return "(" + std::to_string(i) + "LL)";
  }
  const bool f = std::string(compute_type(t)) == "float";
  if (std::isnan(v)) return f ? "__int_as_float(0x7fc00000)" : "__longlong_as_double(0x7ff8000000000000LL)";
  if (std::isinf(v))
    return std::string(v < 0 ? "-" : "") + (f ? "__int_as_float(0x7f800000)" : "__longlong_as_double(0x7ff0000000000000LL)");
  // The value in the compute type, rounded once (to nearest even) as the eager kernels' static_cast<float> of a
  // scalar, then written exactly as a hex float: a 17-digit decimal with an f suffix is rounded a second time
  // by the compiler (1 + 2^-24 became 1 + 2^-23, not 1), like the CPU renderer's literal().
  const double w = f ? static_cast<double>(static_cast<float>(v)) : v;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%a", w);
  return f ? "(" + std::string(buf) + "f)" : "(" + std::string(buf) + ")";
}

bool is_const(const SymInt& s, int64_t v) { return s.is_constant() && s.value == v; }

// What a reduction node starts from, in its compute type, and the preamble functor that combines two partials.
std::string reduce_identity(const Node& n) {
  const std::string T = compute_type(n.dtype);
  const bool fl = is_floating(n.dtype);
  if (n.op == Op::ReduceSum) return "(" + T + ")0";
  if (n.op == Op::ReduceMax) return fl ? "-" + literal(INFINITY, n.dtype) : "(-9223372036854775807LL - 1)";
  return fl ? literal(INFINITY, n.dtype) : "9223372036854775807LL";
}
const char* reduce_functor(Op op) {
  return op == Op::ReduceSum ? "ig_op_sum()" : op == Op::ReduceMax ? "ig_op_max()" : "ig_op_min()";
}

RenderedKernel Renderer::run() {
  classify();
  plan();
  RenderedKernel out;
  out.abi.kind = k_.kind;
  out.abi.num_buffers = static_cast<int>(k_.buffers.size());
  out.abi.num_syms = k_.num_syms;
  out.abi.num_scalars = k_.num_scalars;
  out.abi.sym_slots = std::max(1, k_.num_syms);
  out.abi.scalar_slots = std::max(1, k_.num_scalars);
  out.abi.vector_width = vec_;
  out.abi.index32 = I_ == "int";
  out.abi.dims = k_.dims;
  header_comment();
  switch (k_.kind) {
    case KernelKind::Pointwise:
      params_struct();
      pointwise();
      out.abi.functions = {sym_};
      break;
    case KernelKind::RowReduction:
      params_struct();
      if (const size_t sums = column_sums().size(); sums > 0) {  // Note [Column sums in row reductions]
        row_reduction(kWarp);
        column_finish();
        out.abi.functions = {sym_ + "_warp", "", "", "", sym_ + "_colfin"};
        out.abi.column_sums = static_cast<int>(sums);
        break;
      }
      row_reduction(kWarp);
      row_reduction(kBlock);
      row_reduction(kColumns);
      out.abi.functions = {sym_ + "_warp", sym_ + "_block", sym_ + "_col"};
      out.abi.prefer_columns = prefer_columns();
      if (out.abi.prefer_columns && splittable()) {
        row_reduction(kColumnsSplit);
        out.abi.functions.push_back(sym_ + "_colsplit");
        for (const Node& n : k_.nodes) out.abi.split_reductions += is_reduction(n.op) ? 1 : 0;
      }
      break;
    case KernelKind::MultiTensor:
      multi_tensor();
      out.abi.functions = {sym_};
      break;
  }
  out.source = os_.str();
  return out;
}

void Renderer::open(const std::string& s) {
  line(s);
  ++indent_;
}

void Renderer::close(const std::string& s) {
  --indent_;
  line(s);
}

std::string Renderer::as(int id, DType t) const {
  const DType from = k_.nodes[id].dtype;
  if (std::string(compute_type(from)) == compute_type(t)) return v(id);
  if (t == DType::b8) return "(" + v(id) + " != 0)";
  return std::string("(") + compute_type(t) + ")(" + v(id) + ")";
}

void Renderer::header_comment() {
  static const char* kinds[] = {"pointwise", "row reduction", "multi-tensor"};
  std::string dims;
  for (const SymInt& d : k_.dims) dims += (dims.empty() ? "" : ", ") + sym_str(d);
  line("// " + (k_.name.empty() ? std::string("kernel") : k_.name) + ": " + kinds[static_cast<int>(k_.kind)] +
       (k_.kind == KernelKind::MultiTensor ? "" : " over [" + dims + "]") + ", vector width " +
       std::to_string(vec_) + ", " + I_ + " indices");
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

// Which nodes are invariant (constants and scalars only), element level, and in which reduction phase.
void Renderer::classify() {
  const size_t n = k_.nodes.size();
  element_ = element_level_nodes(k_);
  invariant_.assign(n, false);
  level_.assign(n, 0);
  used_.assign(k_.buffers.size(), false);
  for (const Store& s : k_.stores) used_[s.buffer] = true;
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = k_.nodes[i];
    if (nd.op == Op::Load) used_[nd.arg] = true;
    if (nd.op == Op::Const || nd.op == Op::Scalar) {
      invariant_[i] = true;
      continue;
    }
    if (nd.op == Op::Load || nd.op == Op::Index) continue;
    bool inv = !is_reduction(nd.op) && nd.op != Op::ColumnSum;
    int lvl = 0;
    for (int o : {nd.a, nd.b, nd.c}) {
      if (o < 0) continue;
      inv = inv && invariant_[o];
      lvl = std::max(lvl, level_[o]);
    }
    invariant_[i] = inv;
    level_[i] = is_reduction(nd.op) ? lvl + 1 : lvl;
  }
}

// Index width and vector plan. The vector path needs every used buffer's innermost stride to be the
// constant 0 or 1 (1 for outputs) and constant outer strides of unit-stride buffers to be multiples of
// the width; what is only known at run time (sizes, pointers, symbolic strides) is checked by the kernel.
void Renderer::plan() {
  I_ = "long long";
  vec_ = 1;
  if (k_.kind == KernelKind::MultiTensor) {
    size_t min_size = 8;
    for (const Buffer& buf : k_.buffers) min_size = std::min(min_size, itemsize(buf.dtype));
    vec_ = std::min<int>(8, static_cast<int>(16 / min_size));
    for (size_t i = 0; i < k_.buffers.size(); ++i) unit_.push_back(used_[i]);
    return;
  }
  // 32-bit indices when every size and stride is constant and every offset (and the grid-stride loop
  // counter) stays far below 2^31.
  bool small = true;
  double total = 1;
  for (const SymInt& d : k_.dims) {
    small = small && d.is_constant();
    total *= d.is_constant() ? static_cast<double>(d.value) : 0;
  }
  for (const Buffer& buf : k_.buffers) {
    double reach = 0;
    for (size_t d = 0; d < buf.strides.size(); ++d) {
      small = small && buf.strides[d].is_constant();
      if (small) reach += std::abs(static_cast<double>(buf.strides[d].value)) * std::max<double>(0, k_.dims[d].value - 1);
    }
    small = small && reach < (1 << 30);
  }
  if (small && total < (1 << 30)) I_ = "int";
  if (k_.dims.empty()) return;
  const int L = last();
  size_t min_size = 8;
  bool any_unit = false;
  unit_.assign(k_.buffers.size(), false);
  for (size_t i = 0; i < k_.buffers.size(); ++i) {
    if (!used_[i]) continue;
    const Buffer& buf = k_.buffers[i];
    const SymInt& s = buf.strides[L];
    if (is_const(s, 1)) {
      unit_[i] = true;
      any_unit = true;
      min_size = std::min(min_size, itemsize(buf.dtype));
    } else if (!is_const(s, 0) || buf.is_output) {
      if (!(k_.kind == KernelKind::RowReduction && buf.is_output && is_const(s, 0))) return;  // row outputs are fine
    }
  }
  if (!any_unit) return;
  const int w = std::min<int>(8, static_cast<int>(16 / min_size));
  if (k_.dims[L].is_constant() && k_.dims[L].value % w != 0) return;
  for (size_t i = 0; i < k_.buffers.size(); ++i) {
    if (!unit_[i]) continue;
    for (int d = 0; d < L; ++d) {
      const SymInt& s = k_.buffers[i].strides[d];
      if (s.is_constant() && s.value % w != 0) return;
    }
  }
  vec_ = w;
}

void Renderer::params_struct() {
  line("struct " + sym_ + "_p {");
  line("  void* b[" + std::to_string(k_.buffers.size()) + "];");
  line("  long long s[" + std::to_string(std::max(1, k_.num_syms)) + "];");
  line("  double c[" + std::to_string(std::max(1, k_.num_scalars)) + "];");
  line("  long long flags;");
  if (k_.kind == KernelKind::RowReduction) {
    line("  void* ws;  // _colsplit's partials and tile counters, or the blocks' column sums");
    line("  long long parts;  // column sums: blocks of the _warp launch (partials in ws)");
  }
  line("};");
}

// Note [Split column reductions]: a transposed reduction over many columns and few rows (a bias gradient:
// 768 rows of 16384 tokens) gives the _col variant one block per 32 rows, 24 blocks on a 132-SM GPU. The
// _colsplit variant also splits the columns over gridDim.y blocks; each writes its partial per row to the
// workspace, and the last block of a tile to finish (a counter per tile) combines the partials in split
// order, so the result does not depend on which block finished last, runs the epilogue and resets the
// counter for the next launch. Only for one reduction phase with row outputs only, in float or double.
bool Renderer::splittable() const {
  if (last() < 1) return false;
  for (size_t i = 0; i < k_.nodes.size(); ++i) {
    if (level_[i] > 1) return false;
    const std::string T = compute_type(k_.nodes[i].dtype);
    if (is_reduction(k_.nodes[i].op) && T != "float" && T != "double") return false;
  }
  for (const Store& st : k_.stores)
    if (element_buffer(static_cast<size_t>(st.buffer))) return false;
  return true;
}

// Syms, sizes, buffers and the invariant nodes at the top of a Pointwise/RowReduction function.
void Renderer::prologue() {
  line("typedef " + I_ + " I;");
  std::set<int> slots;
  for (const SymInt& d : k_.dims)
    if (!d.is_constant()) slots.insert(d.sym);
  for (const Buffer& buf : k_.buffers)
    for (const SymInt& s : buf.strides)
      if (!s.is_constant()) slots.insert(s.sym);
  for (int s : slots) line("const long long s" + std::to_string(s) + " = p.s[" + std::to_string(s) + "];");
  for (size_t d = 0; d < k_.dims.size(); ++d)
    line("const I n" + std::to_string(d) + " = (I)(" + sym_str(k_.dims[d]) + ");");
  declare_buffers([](int i) { return "p.b[" + std::to_string(i) + "]"; });
  for (size_t i = 0; i < k_.nodes.size(); ++i)
    if (invariant_[i]) emit_node(static_cast<int>(i));
}

// The run-time condition for the vector path: sizes, symbolic outer strides and pointer alignment.
std::string Renderer::vector_condition(const std::string& inner_size) const {
  std::string c = "(p.flags & 1) != 0";
  if (!inner_size.empty()) c += " && " + inner_size + " % " + std::to_string(vec_) + " == 0";
  for (size_t i = 0; i < k_.buffers.size(); ++i) {
    if (!unit_[i]) continue;
    const size_t bytes = std::min<size_t>(16, vec_ * itemsize(k_.buffers[i].dtype));
    c += " && (((unsigned long long)" + b(static_cast<int>(i)) + ") & " + std::to_string(bytes - 1) + ") == 0";
    for (int d = 0; d < last(); ++d) {
      const SymInt& s = k_.buffers[i].strides[d];
      if (!s.is_constant()) c += " && " + sym_str(s) + " % " + std::to_string(vec_) + " == 0";
    }
  }
  return c;
}

std::string Renderer::load_expr(int buf) const {
  const std::string x = acc_[buf];
  switch (k_.buffers[buf].dtype) {
    case DType::bf16: return "ig_ld_bf16(" + x + ")";
    case DType::f16: return "ig_ld_f16(" + x + ")";
    case DType::b8: return "(" + x + " != 0)";
    case DType::i32: return "(long long)(" + x + ")";
    default: return x;
  }
}

std::string Renderer::store_stmt(int buf, int node) const {
  const DType t = k_.buffers[buf].dtype;
  const std::string val = as(node, t);
  std::string rhs;
  switch (t) {
    case DType::bf16: rhs = "ig_st_bf16(" + val + ")"; break;
    case DType::f16: rhs = "ig_st_f16(" + val + ")"; break;
    default: rhs = std::string("(") + storage_type(t) + ")(" + val + ")"; break;
  }
  return acc_[buf] + " = " + rhs + ";";
}

std::string Renderer::unary_expr(const Node& n) const {
  // Math on integers goes through double (CUDA's math functions have no integer overloads).
  const bool int_math = !is_floating(n.dtype) && n.op != Op::Neg && n.op != Op::Abs && n.op != Op::Square &&
                        n.op != Op::Relu && n.op != Op::Sign && n.op != Op::Not && n.op != Op::Cast;
  const DType t = int_math ? DType::f64 : n.dtype;
  const std::string a = int_math ? "(double)" + v(n.a) : as(n.a, t), T = compute_type(t);
  if (int_math) {
    Node d = n;
    d.dtype = DType::f64;
    return "(long long)(" + unary_math(d, a, T) + ")";
  }
  return unary_math(n, a, T);
}

std::string Renderer::unary_math(const Node& n, const std::string& a, const std::string& T) const {
  const DType t = n.dtype;
  const std::string one = "(" + T + ")1";
  switch (n.op) {
    case Op::Neg: return "-" + a;
    case Op::Abs: return is_floating(t) ? fn("fabs", T) + "(" + a + ")" : "(" + a + " < 0 ? -" + a + " : " + a + ")";
    case Op::Exp: return fn("exp", T) + "(" + a + ")";
    case Op::Log: return fn("log", T) + "(" + a + ")";
    case Op::Log1p: return fn("log1p", T) + "(" + a + ")";
    case Op::Expm1: return fn("expm1", T) + "(" + a + ")";
    case Op::Sqrt: return fn("sqrt", T) + "(" + a + ")";
    case Op::Rsqrt: return one + " / " + fn("sqrt", T) + "(" + a + ")";
    case Op::Reciprocal: return one + " / " + a;
    case Op::Square: return a + " * " + a;
    case Op::Sin: return fn("sin", T) + "(" + a + ")";
    case Op::Cos: return fn("cos", T) + "(" + a + ")";
    case Op::Tanh: return fn("tanh", T) + "(" + a + ")";
    case Op::Erf: return fn("erf", T) + "(" + a + ")";
    case Op::Sigmoid:
    case Op::Relu:
    case Op::GeluTanh:
    case Op::GeluErf:
    case Op::Silu: return scalar_math_call(n.op, T, a);
    case Op::Sign: return "(" + T + ")((" + a + " > 0) - (" + a + " < 0))";
    case Op::Floor: return fn("floor", T) + "(" + a + ")";
    case Op::Not: return "!" + as(n.a, DType::b8);
    case Op::Cast:
      // Narrowing to bf16/f16 rounds (the eager round trip); everything else is a C++ conversion.
      if (t == DType::bf16) return "ig_round_bf16(" + as(n.a, DType::f32) + ")";
      if (t == DType::f16) return "ig_round_f16(" + as(n.a, DType::f32) + ")";
      return a;
    default: break;
  }
  INGOT_INTERNAL_CHECK(false, "render_cuda: unary op ", op_name(n.op));
  return {};
}

std::string Renderer::binary_expr(const Node& n) const {
  DType t = n.dtype;
  if (is_comparison(n.op)) t = promote(k_.nodes[n.a].dtype, k_.nodes[n.b].dtype);
  if (n.op == Op::And || n.op == Op::Or) t = DType::b8;
  const std::string x = as(n.a, t), y = as(n.b, t), T = compute_type(n.dtype);
  switch (n.op) {
    case Op::Add: return x + " + " + y;
    case Op::Sub: return x + " - " + y;
    case Op::Mul: return x + " * " + y;
    case Op::Div: return x + " / " + y;
    case Op::Pow:
      if (!is_floating(n.dtype)) return "(long long)pow((double)" + x + ", (double)" + y + ")";
      return "(" + T + ")" + fn("pow", T) + "(" + x + ", " + y + ")";
    case Op::Max: return "ig_max(" + x + ", " + y + ")";
    case Op::Min: return "ig_min(" + x + ", " + y + ")";
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
    default: break;
  }
  INGOT_INTERNAL_CHECK(false, "render_cuda: binary op ", op_name(n.op));
  return {};
}

// `const T vN = ...;` for a non-reduction node, reading buffers through acc_ and indices through idx_.
void Renderer::emit_node(int id) {
  const Node& n = k_.nodes[id];
  const std::string T = compute_type(n.dtype);
  std::string rhs;
  switch (n.op) {
    case Op::Load: rhs = load_expr(n.arg); break;
    case Op::Const: rhs = literal(n.value, n.dtype); break;
    case Op::Scalar: rhs = "(" + T + ")p.c[" + std::to_string(n.arg) + "]"; break;
    case Op::Index: rhs = "(long long)(" + idx_.at(n.arg) + ")"; break;
    case Op::Where: rhs = as(n.a, DType::b8) + " ? " + as(n.b, n.dtype) + " : " + as(n.c, n.dtype); break;
    default: rhs = is_binary(n.op) ? binary_expr(n) : unary_expr(n); break;
  }
  line("const " + T + " " + v(id) + " = " + rhs + ";");
}

// Element-level nodes `roots` need, in topological order (row-level operands are already defined).
std::vector<int> Renderer::element_closure(const std::vector<int>& roots) const {
  std::vector<bool> need(k_.nodes.size(), false);
  for (int r : roots) need[r] = true;
  for (size_t i = k_.nodes.size(); i-- > 0;) {
    if (!need[i] || !element_[i] || is_reduction(k_.nodes[i].op)) continue;  // (ColumnSum is not element level)
    for (int o : {k_.nodes[i].a, k_.nodes[i].b, k_.nodes[i].c})
      if (o >= 0) need[o] = true;
  }
  std::vector<int> out;
  for (size_t i = 0; i < k_.nodes.size(); ++i)
    if (need[i] && element_[i] && !invariant_[i] && !is_reduction(k_.nodes[i].op)) out.push_back(static_cast<int>(i));
  return out;
}

// i<d> for d < upto from the linear index `lin` (innermost fastest); the innermost one (d == upto - 1)
// scaled by `inner_scale` when the loop counts vector groups.
void Renderer::decompose(const std::string& lin, int upto, const std::string& inner_div, const std::string& inner_scale) {
  if (upto == 0) return;
  line("I rest = " + lin + ";");
  for (int d = upto - 1; d >= 0; --d) {
    const std::string nd = d == upto - 1 && !inner_div.empty() ? inner_div : "n" + std::to_string(d);
    std::string val = d == 0 ? "rest" : "rest % " + nd;
    if (d == upto - 1 && !inner_scale.empty()) val = "(" + val + ") * " + inner_scale;
    line("const I i" + std::to_string(d) + " = " + val + ";");
    if (d > 0) line("rest /= " + nd + ";");
  }
  line("(void)rest;");
}

// o<b> = sum over dims d < upto of i<d> * stride, for the used buffers.
void Renderer::offsets(const std::string& prefix, int upto) {
  for (size_t i = 0; i < k_.buffers.size(); ++i) {
    if (!used_[i]) continue;
    std::string s;
    for (int d = 0; d < upto; ++d) {
      const SymInt& st = k_.buffers[i].strides[d];
      if (is_const(st, 0)) continue;
      s += (s.empty() ? "" : " + ") + std::string("i") + std::to_string(d) +
           (is_const(st, 1) ? "" : " * (I)" + sym_str(st));
    }
    line("const I " + prefix + std::to_string(i) + " = " + (s.empty() ? "0" : s) + ";");
  }
}

void Renderer::vector_stores(const std::vector<Store>& outs, const std::string& base, const std::string& off) {
  for (const Store& s : outs)
    line("ig_stv<" + std::to_string(vec_) + ">(" + b(s.buffer) + " + " + base + std::to_string(s.buffer) +
         (off.empty() ? "" : " + " + off) + ", vo" + std::to_string(s.buffer) + ");");
}

std::set<int> Renderer::loaded_by(const std::vector<int>& nodes) const {
  std::set<int> s;
  for (int id : nodes)
    if (k_.nodes[id].op == Op::Load) s.insert(k_.nodes[id].arg);
  return s;
}

}  // namespace detail

namespace {

// Merges adjacent dims that are contiguous in every buffer and drops constant size-1 dims, so a dense n-d
// pointwise kernel is one long loop (fewer divisions per point, longer vector runs). Only for constant
// layouts and kernels that never read the Index of a dim (merging would renumber it).
KernelSpec coalesce_pointwise(KernelSpec k) {
  if (k.kind != KernelKind::Pointwise) return k;
  for (const Node& n : k.nodes)
    if (n.op == Op::Index) return k;
  for (const SymInt& d : k.dims)
    if (!d.is_constant()) return k;
  for (const Buffer& b : k.buffers)
    for (const SymInt& s : b.strides)
      if (!s.is_constant()) return k;
  for (size_t d = 0; d < k.dims.size();) {
    if (k.dims[d].value == 1 && k.dims.size() > 1) {
      k.dims.erase(k.dims.begin() + d);
      for (Buffer& b : k.buffers) b.strides.erase(b.strides.begin() + d);
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
    k.dims.erase(k.dims.begin() + d);
    for (Buffer& b : k.buffers) b.strides.erase(b.strides.begin() + d);
  }
  return k;
}

}  // namespace

RenderedKernel render_kernel(const KernelSpec& spec, const std::string& symbol) {
  spec.validate();
  return detail::Renderer(coalesce_pointwise(canonicalize(spec)), symbol).run();
}

}  // namespace ingot::codegen::cuda
