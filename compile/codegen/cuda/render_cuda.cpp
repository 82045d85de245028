// CUDA rendering of KernelSpecs (see render_cuda.h for the shape of the generated code).
#include "compile/codegen/cuda/render_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "compile/codegen/scalar_math.h"
#include "runtime/error.h"

namespace ingot::codegen::cuda {

namespace {

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

class Renderer {
 public:
  Renderer(const KernelSpec& k, const std::string& symbol) : k_(k), sym_(symbol) {}

  RenderedKernel run() {
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

 private:
  void line(const std::string& s) { os_ << std::string(2 * indent_, ' ') << s << '\n'; }
  void open(const std::string& s) {
    line(s);
    ++indent_;
  }
  void close(const std::string& s = "}") {
    --indent_;
    line(s);
  }
  // append(), not "v" + to_string(): GCC 12 warns (-Wrestrict) on the inlined operator+ here (its bug 105329).
  std::string v(int id) const { return std::string("v").append(std::to_string(id)); }
  std::string b(int id) const { return std::string("b").append(std::to_string(id)); }
  int last() const { return static_cast<int>(k_.dims.size()) - 1; }

  std::string as(int id, DType t) const {
    const DType from = k_.nodes[id].dtype;
    if (std::string(compute_type(from)) == compute_type(t)) return v(id);
    if (t == DType::b8) return "(" + v(id) + " != 0)";
    return std::string("(") + compute_type(t) + ")(" + v(id) + ")";
  }

  void header_comment() {
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
  void classify() {
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
  void plan() {
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

  void params_struct() {
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
  bool splittable() const {
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

  // Typed buffer pointers; `src(i)` is the void* of buffer i.
  template <typename F>
  void declare_buffers(F src) {
    std::vector<bool> aliased(k_.buffers.size(), false);
    for (size_t i = 0; i < k_.buffers.size(); ++i)
      if (k_.buffers[i].alias_of >= 0) aliased[i] = aliased[k_.buffers[i].alias_of] = true;
    for (size_t i = 0; i < k_.buffers.size(); ++i) {
      if (!used_[i]) continue;
      const Buffer& buf = k_.buffers[i];
      const std::string ty = std::string(buf.is_output ? "" : "const ") + storage_type(buf.dtype) + "*";
      line(ty + (aliased[i] ? " " : " __restrict__ ") + b(static_cast<int>(i)) + " = (" + ty + ")(" +
           src(static_cast<int>(i)) + ");");
    }
  }

  // Syms, sizes, buffers and the invariant nodes at the top of a Pointwise/RowReduction function.
  void prologue() {
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
  std::string vector_condition(const std::string& inner_size) const {
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

  std::string load_expr(int buf) const {
    const std::string x = acc_[buf];
    switch (k_.buffers[buf].dtype) {
      case DType::bf16: return "ig_ld_bf16(" + x + ")";
      case DType::f16: return "ig_ld_f16(" + x + ")";
      case DType::b8: return "(" + x + " != 0)";
      case DType::i32: return "(long long)(" + x + ")";
      default: return x;
    }
  }

  std::string store_stmt(int buf, int node) const {
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

  std::string unary_expr(const Node& n) const {
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
  std::string unary_math(const Node& n, const std::string& a, const std::string& T) const {
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

  std::string binary_expr(const Node& n) const {
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
  void emit_node(int id) {
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
  std::vector<int> element_closure(const std::vector<int>& roots) const {
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
  void decompose(const std::string& lin, int upto, const std::string& inner_div, const std::string& inner_scale) {
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
  void offsets(const std::string& prefix, int upto) {
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

  // Vector loads of the unit-stride input buffers in `bufs` at offset `base + off`; declares vo<b> for the
  // unit-stride outputs in `outs`. Sets acc_ to the per-lane elements.
  void vector_accesses(const std::set<int>& bufs, const std::vector<Store>& outs, const std::string& base,
                       const std::string& off) {
    const std::string V = std::to_string(vec_);
    for (int i : bufs) {
      const std::string at = b(i) + " + " + base + std::to_string(i) + (off.empty() ? "" : " + " + off);
      if (unroll_row_ && row_cached_[static_cast<size_t>(i)]) {  // Note [Rows kept in registers]
        acc_[i] = "rb" + std::to_string(i) + "[k][j]";
        continue;
      }
      if (unit_[i] && !k_.buffers[i].is_output) {
        line("alignas(16) " + std::string(storage_type(k_.buffers[i].dtype)) + " vb" + std::to_string(i) + "[" + V + "];");
        line("ig_ldv<" + V + ">(vb" + std::to_string(i) + ", " + at + ");");
        acc_[i] = "vb" + std::to_string(i) + "[j]";
      }
    }
    for (const Store& s : outs) {
      line("alignas(16) " + std::string(storage_type(k_.buffers[s.buffer].dtype)) + " vo" + std::to_string(s.buffer) +
           "[" + V + "];");
      acc_[s.buffer] = "vo" + std::to_string(s.buffer) + "[j]";
    }
  }
  void vector_stores(const std::vector<Store>& outs, const std::string& base, const std::string& off) {
    for (const Store& s : outs)
      line("ig_stv<" + std::to_string(vec_) + ">(" + b(s.buffer) + " + " + base + std::to_string(s.buffer) +
           (off.empty() ? "" : " + " + off) + ", vo" + std::to_string(s.buffer) + ");");
  }
  std::set<int> loaded_by(const std::vector<int>& nodes) const {
    std::set<int> s;
    for (int id : nodes)
      if (k_.nodes[id].op == Op::Load) s.insert(k_.nodes[id].arg);
    return s;
  }

  void pointwise() {
    const int nd = static_cast<int>(k_.dims.size());
    open("extern \"C\" __global__ void __launch_bounds__(1024) " + sym_ + "(const " + sym_ + "_p p) {");
    prologue();
    std::vector<int> body;
    for (size_t i = 0; i < k_.nodes.size(); ++i)
      if (!invariant_[i]) body.push_back(static_cast<int>(i));
    std::string total;
    for (int d = 0; d < nd; ++d) total += (d ? " * " : "") + std::string("n") + std::to_string(d);
    line("const I total = " + (total.empty() ? std::string("1") : total) + ";");
    line("const I nthreads = (I)gridDim.x * blockDim.x;");
    acc_.assign(k_.buffers.size(), "");
    idx_.clear();
    for (int d = 0; d < nd; ++d) idx_.push_back("i" + std::to_string(d));
    if (vec_ > 1) {
      const std::string V = std::to_string(vec_), nl = "n" + std::to_string(nd - 1);
      open("if (" + vector_condition(nl) + ") {");
      line("const I groups_inner = " + nl + " / " + V + ";");
      open("for (I g = (I)blockIdx.x * blockDim.x + threadIdx.x; g < total / " + V + "; g += nthreads) {");
      decompose("g", nd, "groups_inner", V);
      offsets("o", nd);  // unit-stride buffers: the first element of the group; broadcast ones: their element
      for (size_t i = 0; i < k_.buffers.size(); ++i)
        if (used_[i]) acc_[i] = b(static_cast<int>(i)) + "[o" + std::to_string(i) + "]";
      vector_accesses(loaded_by(body), k_.stores, "o", "");
      idx_[nd - 1] = "(i" + std::to_string(nd - 1) + " + j)";
      line("#pragma unroll");
      open("for (int j = 0; j < " + V + "; ++j) {");
      for (int id : body) emit_node(id);
      for (const Store& s : k_.stores) line(store_stmt(s.buffer, s.node));
      close();
      vector_stores(k_.stores, "o", "");
      close();
      line("return;");
      close();
      idx_[nd - 1] = "i" + std::to_string(nd - 1);
    }
    open("for (I lin = (I)blockIdx.x * blockDim.x + threadIdx.x; lin < total; lin += nthreads) {");
    decompose("lin", nd, "", "");
    offsets("o", nd);
    for (size_t i = 0; i < k_.buffers.size(); ++i)
      if (used_[i]) acc_[i] = b(static_cast<int>(i)) + "[o" + std::to_string(i) + "]";
    for (int id : body) emit_node(id);
    for (const Store& s : k_.stores) line(store_stmt(s.buffer, s.node));
    close();
    close();
  }

  // One column loop over the current row: scalar (`c` from tid by nt) or vector (groups of vec_ columns).
  // `body` emits the per-column statements (acc_ and idx_ already point at the column).
  template <typename Body>
  void column_loop(const std::vector<int>& closure, const std::vector<Store>& outs, Body body) {
    const int L = last();
    const std::string nl = "n" + std::to_string(L);
    auto point_scalar = [&]() {
      for (size_t i = 0; i < k_.buffers.size(); ++i)
        if (used_[i]) acc_[i] = b(static_cast<int>(i)) + "[r" + std::to_string(i) + (element_buffer(i) ? " + c" + col_stride(i) : "") + "]";
      idx_[L] = "c";
    };
    const bool vector = vec_ > 1 && !columns_;
    if (vector) {
      const std::string V = std::to_string(vec_);
      open("if (vec) {");
      // Note [Rows kept in registers]: each phase walks the lane's chunks of the row and reads the cached
      // buffers from rb<i>[k] (load_row) instead of loading them again.
      if (unroll_row_) open_row_chunks();
      else open("for (I c = tid * " + V + "; c < " + nl + "; c += nt * " + V + ") {");
      point_scalar();
      vector_accesses(loaded_by(closure), outs, "r", "c");
      idx_[L] = "(c + j)";
      line("#pragma unroll");
      open("for (int j = 0; j < " + V + "; ++j) {");
      body();
      close();
      vector_stores(outs, "r", "c");
      close();
      if (unroll_row_) close();
      close("} else {");
      ++indent_;
    }
    // Column variants load 2-4 bytes per lane and step and reach ~1.4-2.0 of an H100's 3.35 TB/s; unrolling
    // this loop by 4 changed nothing (0.754 vs 0.753 ms per GPT-2 step), 16-byte loads of 8 columns per lane
    // would (Note [Column sums], runtime/kernels/cuda/reduce.cu).
    if (col_begin_.empty()) open("for (I c = tid; c < " + nl + "; c += nt) {");
    else open("for (I c = " + col_begin_ + " + tid; c < " + col_end_ + "; c += nt) {");
    point_scalar();
    body();
    close();
    if (vector) close();
    point_row();
  }
  bool element_buffer(size_t i) const { return !is_const(k_.buffers[i].strides[last()], 0); }
  std::string col_stride(size_t i) const {
    const SymInt& s = k_.buffers[i].strides[last()];
    return is_const(s, 1) ? "" : " * (I)" + sym_str(s);
  }
  // Row-level accesses: the buffer's element of this row.
  void point_row() {
    for (size_t i = 0; i < k_.buffers.size(); ++i)
      if (used_[i]) acc_[i] = b(static_cast<int>(i)) + "[r" + std::to_string(i) + "]";
  }

  // A transposed reduction (layer_norm's dw): no element buffer is contiguous along the reduced dim, but
  // one is along the last row dim, so lanes should map to rows (kColumns) for coalesced loads. Buffers that
  // every row reads alike (stride 0 along the last row dim: layer_norm's per-token mean and rstd here) are
  // one row of data that stays in cache, so their layout does not decide.
  bool prefer_columns() const {
    const int L = last();
    if (L < 1) return false;
    bool any_row_unit = false;
    for (size_t i = 0; i < k_.buffers.size(); ++i) {
      if (!used_[i] || !element_buffer(i) || is_const(k_.buffers[i].strides[L - 1], 0)) continue;
      if (is_const(k_.buffers[i].strides[L], 1)) return false;
      any_row_unit = any_row_unit || is_const(k_.buffers[i].strides[L - 1], 1);
    }
    return any_row_unit;
  }

  // kWarp: one warp per row; kBlock: one block per row; kColumns: threadIdx.x picks the row (consecutive
  // lanes, consecutive rows), threadIdx.y splits its columns, partials combined through shared memory.
  enum Variant { kWarp, kBlock, kColumns, kColumnsSplit };
  void row_reduction(Variant variant) {
    const int L = last();
    static const char* suffix[] = {"_warp", "_block", "_col", "_colsplit"};
    // Note [Rows kept in registers]: one warp per row of constant length, and at most 48 loaded values per lane
    // from buffers that differ between rows (two rows of 768: a layer norm's residual add; with three, as in the
    // norm backward, register pressure made it slower: 1.73 -> 1.82 ms per GPT-2 step). A norm's weight, the
    // same for every row, is not counted. Each such buffer's share of the row is loaded once, into rb<i>[k][j]
    // (chunk k of the lane's row_chunks_), which every phase reads: left to the compiler, the phases' repeated
    // loads were not merged (the forward norm's PTX held 3x its loads). The function is then built for blocks of
    // at most kWarpRowMaxThreads (Note [Warp-per-row launch bounds], render_cuda.h), so the row has registers.
    const SymInt& row_len = k_.dims[static_cast<size_t>(L)];
    int64_t row_loads = 0;
    row_cached_.assign(k_.buffers.size(), false);  // read only while unroll_row_
    for (size_t i = 0; i < k_.buffers.size(); ++i) {
      if (!used_[i] || k_.buffers[i].is_output || !element_buffer(i)) continue;
      bool per_row = false;
      for (int d = 0; d < L; ++d) per_row = per_row || !is_const(k_.buffers[i].strides[static_cast<size_t>(d)], 0);
      row_loads += per_row;
      row_cached_[i] = per_row && unit_[i];
    }
    const int64_t chunks = row_len.is_constant() ? (row_len.value + 32 * vec_ - 1) / (32 * vec_) : 0;
    unroll_row_ = variant == kWarp && vec_ > 1 && row_len.is_constant() && row_loads * chunks * vec_ <= 48;
    row_chunks_ = unroll_row_ ? static_cast<int>(chunks) : 0;
    const std::string bounds = unroll_row_
                                   ? "__launch_bounds__(" + std::to_string(kWarpRowMaxThreads) + ", 2)"
                                   : std::string("__launch_bounds__(1024)");
    open("extern \"C\" __global__ void " + bounds + " " + sym_ + suffix[variant] + "(const " + sym_ + "_p p) {");
    prologue();
    const bool block = variant == kBlock, split = variant == kColumnsSplit;
    columns_ = variant == kColumns || split;
    std::string rows;
    for (int d = 0; d < L; ++d) rows += (d ? " * " : "") + std::string("n") + std::to_string(d);
    line("const I rows = " + (rows.empty() ? std::string("1") : rows) + ";");
    if (vec_ > 1 && !columns_) line("const bool vec = " + vector_condition("n" + std::to_string(L)) + ";");
    const std::vector<Store> col_sums = column_sums();
    if (!col_sums.empty()) column_sum_setup(col_sums.size());
    acc_.assign(k_.buffers.size(), "");
    idx_.assign(k_.dims.size(), "");
    for (int d = 0; d < L; ++d) idx_[d] = "i" + std::to_string(d);
    std::vector<int> reds_all;
    for (size_t i = 0; i < k_.nodes.size(); ++i)
      if (is_reduction(k_.nodes[i].op)) reds_all.push_back(static_cast<int>(i));
    if (block) {
      for (int r : reds_all)
        line("__shared__ " + std::string(compute_type(k_.nodes[r].dtype)) + " sm" + std::to_string(r) + "[32];");
      line("const I tid = threadIdx.x, nt = blockDim.x;");
      open("for (I row = blockIdx.x; row < rows; row += gridDim.x) {");
    } else if (columns_) {
      for (int r : reds_all)
        line("__shared__ " + std::string(compute_type(k_.nodes[r].dtype)) + " sm" + std::to_string(r) + "[1024];");
      if (split) line("__shared__ bool ig_last;");
      line("const I tid = threadIdx.y, nt = blockDim.y;");
      if (split) {
        open("{  // gridDim.x covers every tile of rows, gridDim.y splits the columns");
        line("const I row0 = (I)blockIdx.x * blockDim.x;");
      } else {
        open("for (I row0 = (I)blockIdx.x * blockDim.x; row0 < rows; row0 += (I)gridDim.x * blockDim.x) {");
      }
      line("const bool active = row0 + (I)threadIdx.x < rows;");
      line("// Idle lanes of the last tile reread the last row (loads stay in bounds) and store nothing.");
      line("const I row = active ? row0 + (I)threadIdx.x : rows - 1;");
    } else {
      line("const I tid = threadIdx.x & 31, nt = 32, warps = blockDim.x >> 5;");
      open("for (I row = (I)blockIdx.x * warps + (threadIdx.x >> 5); row < rows; row += (I)gridDim.x * warps) {");
    }
    decompose("row", L, "", "");
    offsets("r", L);
    point_row();
    if (unroll_row_) load_row();
    int max_level = 0;
    for (size_t i = 0; i < k_.nodes.size(); ++i) max_level = std::max(max_level, level_[i]);
    auto emit_row_nodes = [&](int lvl) {
      point_row();
      for (size_t i = 0; i < k_.nodes.size(); ++i)
        if (!invariant_[i] && !element_[i] && !is_reduction(k_.nodes[i].op) && k_.nodes[i].op != Op::ColumnSum &&
            level_[i] == lvl)
          emit_node(static_cast<int>(i));
    };
    emit_row_nodes(0);
    for (int p = 1; p <= max_level; ++p) {
      std::vector<int> reds, operands;
      for (int r : reds_all)
        if (level_[r] == p) {
          reds.push_back(r);
          operands.push_back(k_.nodes[r].a);
        }
      for (int r : reds) {
        const Node& nr = k_.nodes[r];
        line(std::string(compute_type(nr.dtype)) + " acc" + std::to_string(r) + " = " + reduce_identity(nr) + ";  // " +
             op_name(nr.op));
      }
      const std::vector<int> closure = element_closure(operands);
      if (split) {
        const std::string nl = "n" + std::to_string(L);
        line("const I cb = (I)((long long)" + nl + " * blockIdx.y / gridDim.y), ce = (I)((long long)" + nl +
             " * (blockIdx.y + 1) / gridDim.y);");
        col_begin_ = "cb";
        col_end_ = "ce";
      }
      column_loop(closure, {}, [&] {
        for (int id : closure) emit_node(id);
        for (int r : reds) {
          const Node& nr = k_.nodes[r];
          const std::string acc = "acc" + std::to_string(r), x = as(nr.a, nr.dtype);
          if (nr.op == Op::ReduceSum) line(acc + " += " + x + ";");
          else line(acc + " = " + (nr.op == Op::ReduceMax ? "ig_max(" : "ig_min(") + acc + ", " + x + ");");
        }
      });
      col_begin_.clear();
      col_end_.clear();
      if (split) split_combine(reds);
      for (int r : reds) {
        const Node& nr = k_.nodes[r];
        const std::string f = reduce_functor(nr.op);
        const std::string acc = "acc" + std::to_string(r);
        const std::string combine = block      ? "ig_block_reduce(" + acc + ", " + f + ", sm" + std::to_string(r) + ")"
                                    : columns_ ? "ig_col_reduce(" + acc + ", " + f + ", sm" + std::to_string(r) + ")"
                                               : "ig_warp_reduce(" + acc + ", " + f + ")";
        line("const " + std::string(compute_type(nr.dtype)) + " " + v(r) + " = " + combine + ";");
      }
      emit_row_nodes(p);
    }
    std::vector<Store> element_stores, row_stores;
    for (const Store& s : k_.stores) {
      if (k_.nodes[s.node].op == Op::ColumnSum) continue;
      (element_buffer(s.buffer) ? element_stores : row_stores).push_back(s);
    }
    if (!element_stores.empty() || !col_sums.empty()) {
      std::vector<int> roots;
      for (const Store& s : element_stores) roots.push_back(s.node);
      for (const Store& s : col_sums) roots.push_back(k_.nodes[s.node].a);
      const std::vector<int> closure = element_closure(roots);
      column_loop(closure, element_stores, [&] {
        for (int id : closure) emit_node(id);
        for (const Store& s : element_stores) line((columns_ ? "if (active) " : "") + store_stmt(s.buffer, s.node));
        for (size_t j = 0; j < col_sums.size(); ++j)
          line("ig_cs" + std::to_string(j) + "[" + padded(idx_[L]) + "] += " + as(k_.nodes[col_sums[j].node].a, DType::f32) +
               ";");
      });
    }
    if (!row_stores.empty()) {
      point_row();
      open(columns_ ? "if (active && tid == 0) {" : "if (tid == 0) {");
      for (const Store& s : row_stores) line(store_stmt(s.buffer, s.node));
      close();
    }
    close();
    if (!col_sums.empty()) column_sum_partials(col_sums.size());
    close();
    columns_ = false;
    unroll_row_ = false;
  }

  // Opens the loop over this lane's row_chunks_ chunks of the row (chunk k starts at column c) and its bound
  // check; the caller closes both.
  void open_row_chunks() {
    const std::string V = std::to_string(vec_);
    line("#pragma unroll");
    open("for (int k = 0; k < " + std::to_string(row_chunks_) + "; ++k) {");
    line("const I c = tid * " + V + " + k * nt * " + V + ";");
    open("if (c < n" + std::to_string(last()) + ") {");
  }

  // Note [Rows kept in registers]: this lane's chunks of the row of every cached buffer, loaded once per row.
  void load_row() {
    const std::string V = std::to_string(vec_), K = std::to_string(row_chunks_);
    for (size_t i = 0; i < k_.buffers.size(); ++i)
      if (row_cached_[i])
        line("alignas(16) " + std::string(storage_type(k_.buffers[i].dtype)) + " rb" + std::to_string(i) + "[" + K +
             "][" + V + "];");
    open("if (vec) {");
    open_row_chunks();
    for (size_t i = 0; i < k_.buffers.size(); ++i)
      if (row_cached_[i])
        line("ig_ldv<" + V + ">(rb" + std::to_string(i) + "[k], " + b(static_cast<int>(i)) + " + r" +
             std::to_string(i) + " + c);");
    close();
    close();
    close();
  }

  // Note [Column sums in row reductions]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A layer norm's backward needs dx per row (a row reduction) and dw, db per column (sums over every row) of
  // the same values. As two kernels the second reads dy and x again: 75 MB per GPT-2 norm at b16, 25 norms,
  // 0.7 ms per H200 step. Here the dx kernel also adds each ColumnSum operand into a per-warp row of shared
  // memory (each column has one owner lane per warp, so no atomics); at the end the block adds its warps' rows
  // in warp order and writes one partial row per block to the workspace, and <symbol>_colfin adds the blocks'
  // partials in block order. Every step has a fixed order, so the sums do not depend on scheduling. Only the
  // warp-per-row variant is generated; the launcher caps its grid so that the partials stay small.
  std::vector<Store> column_sums() const {
    std::vector<Store> out;
    for (const Store& s : k_.stores)
      if (k_.nodes[s.node].op == Op::ColumnSum) out.push_back(s);
    return out;
  }
  // Column c of a shared row (render_cuda.h, column_sum_row: a padding float after every vector of columns).
  std::string padded(const std::string& c) const {
    return vec_ > 1 ? "(" + c + ") + (" + c + ") / " + std::to_string(vec_) : c;
  }
  // Shared rows ig_cs<j> of this warp, zeroed.
  void column_sum_setup(size_t count) {
    const std::string nl = "n" + std::to_string(last());
    line("extern __shared__ float ig_cs[];  // [column sums][warps][ig_row]");
    line("const long long ig_row = " + (vec_ > 1 ? nl + " + " + nl + " / " + std::to_string(vec_) + " + 1" : nl) + ";");
    line("const int ig_warps = blockDim.x >> 5, ig_warp = threadIdx.x >> 5;");
    line("for (long long i = threadIdx.x; i < " + std::to_string(count) +
         "LL * ig_warps * ig_row; i += blockDim.x) ig_cs[i] = 0.0f;");
    line("__syncthreads();");
    for (size_t j = 0; j < count; ++j)
      line("float* ig_cs" + std::to_string(j) + " = ig_cs + (" + std::to_string(j) + "LL * ig_warps + ig_warp) * ig_row;");
  }
  // After the row loop: the block's partial of every column sum, its warps added in order.
  void column_sum_partials(size_t count) {
    const std::string nl = "n" + std::to_string(last());
    line("__syncthreads();");
    open("for (long long c = threadIdx.x; c < " + std::to_string(count) + "LL * " + nl + "; c += blockDim.x) {");
    line("const long long j = c / " + nl + ", col = c % " + nl + ";");
    line("float s = 0.0f;");
    line("for (int w = 0; w < ig_warps; ++w) s += ig_cs[(j * ig_warps + w) * ig_row + " + padded("col") + "];");
    line("((float*)p.ws)[(j * gridDim.x + blockIdx.x) * " + nl + " + col] = s;");
    close();
  }
  // <symbol>_colfin: 32 columns x 32 lanes per block; lane y adds the partials y, y + 32, ... and the lanes are
  // added in order; the total is stored like any output (rounded to the buffer's dtype).
  void column_finish() {
    const std::vector<Store> sums = column_sums();
    const int L = last();
    const std::string nl = "n" + std::to_string(L);
    open("extern \"C\" __global__ void __launch_bounds__(1024) " + sym_ + "_colfin(const " + sym_ + "_p p) {");
    prologue();
    line("__shared__ float ig_lanes[32][33];");
    line("const I c = (I)blockIdx.x * 32 + threadIdx.x;");
    line("const float* ig_part = (const float*)p.ws;");
    acc_.assign(k_.buffers.size(), "");
    for (size_t j = 0; j < sums.size(); ++j) {
      const Store& st = sums[j];
      const std::string J = std::to_string(j);
      open("{");
      line("float s = 0.0f;");
      open("if (c < " + nl + ") {");
      line("const float* q = ig_part + " + J + "LL * p.parts * " + nl + " + c;");
      line("for (long long b = threadIdx.y; b < p.parts; b += 32) s += q[b * " + nl + "];");
      close();
      line("ig_lanes[threadIdx.y][threadIdx.x] = s;");
      line("__syncthreads();");
      open("if (threadIdx.y == 0 && c < " + nl + ") {");
      line("float t = 0.0f;");
      line("for (int y = 0; y < 32; ++y) t += ig_lanes[y][threadIdx.x];");
      line("const " + std::string(compute_type(k_.nodes[st.node].dtype)) + " " + v(st.node) + " = t;");
      acc_[st.buffer] = b(st.buffer) + "[c" + col_stride(static_cast<size_t>(st.buffer)) + "]";
      line(store_stmt(st.buffer, st.node));
      close();
      line("__syncthreads();");
      close();
    }
    close();
  }

  // Note [Split column reductions]: the block's partials acc<r> go to the workspace; the tile's last block
  // leaves acc<r> holding this thread's share of every split's partial (threadIdx.y strides the splits) for
  // the usual combine, and every other block returns.
  void split_combine(const std::vector<int>& reds) {
    line("char* ig_ws = (char*)p.ws;");
    line("unsigned int* ig_count = (unsigned int*)ig_ws;");
    for (size_t j = 0; j < reds.size(); ++j) {
      const int r = reds[j];
      const std::string T = compute_type(k_.nodes[r].dtype), R = std::to_string(r);
      const std::string f = reduce_functor(k_.nodes[r].op);
      line(T + "* ig_part" + R + " = (" + T + "*)(ig_ws + " + std::to_string(kSplitCounterBytes) + " + " +
           std::to_string(j) + "LL * gridDim.y * rows * 8);");
      line("{ const " + T + " q = ig_col_reduce(acc" + R + ", " + f + ", sm" + R + ");");
      line("  if (active && tid == 0) ig_part" + R + "[(long long)blockIdx.y * rows + row] = q; }");
    }
    line("__threadfence();");
    line("__syncthreads();");
    line("if (threadIdx.x == 0 && threadIdx.y == 0) ig_last = atomicAdd(&ig_count[blockIdx.x], 1u) == gridDim.y - 1;");
    line("__syncthreads();");
    line("if (!ig_last) return;");
    line("__threadfence();");
    for (int r : reds) line("acc" + std::to_string(r) + " = " + reduce_identity(k_.nodes[r]) + ";");
    open("for (unsigned int s = threadIdx.y; s < gridDim.y; s += blockDim.y) {");
    for (int r : reds) {
      const std::string R = std::to_string(r);
      line("acc" + R + " = " + reduce_functor(k_.nodes[r].op) + "(acc" + R + ", __ldcg(&ig_part" + R +
           "[(long long)s * rows + row]));");
    }
    close();
    line("if (threadIdx.x == 0 && threadIdx.y == 0) ig_count[blockIdx.x] = 0;  // ready for the next launch");
  }

  void multi_tensor() {
    const std::string nb = std::to_string(k_.buffers.size()), V = std::to_string(vec_);
    line("struct " + sym_ + "_t {");
    line("  void* b[" + nb + "];");
    line("  long long n;");
    line("};");
    line("struct " + sym_ + "_p {");
    line("  const void* table;");
    line("  long long num_tensors, num_chunks, chunk;");
    line("  double c[" + std::to_string(std::max(1, k_.num_scalars)) + "];");
    line("  long long flags;");
    line("};");
    open("extern \"C\" __global__ void __launch_bounds__(1024) " + sym_ + "(const " + sym_ + "_p p) {");
    line("typedef long long I;");
    for (size_t i = 0; i < k_.nodes.size(); ++i)
      if (invariant_[i]) emit_node(static_cast<int>(i));
    line("const " + sym_ + "_t* tab = (const " + sym_ + "_t*)p.table;");
    line("const long long* chunks = (const long long*)(tab + p.num_tensors);");
    open("for (long long ch = blockIdx.x; ch < p.num_chunks; ch += gridDim.x) {");
    line("const long long t = chunks[2 * ch], start = chunks[2 * ch + 1], n = tab[t].n;");
    line("const long long end = start + p.chunk < n ? start + p.chunk : n;");
    declare_buffers([](int i) { return "tab[t].b[" + std::to_string(i) + "]"; });
    std::vector<int> body;
    for (size_t i = 0; i < k_.nodes.size(); ++i)
      if (!invariant_[i]) body.push_back(static_cast<int>(i));
    acc_.assign(k_.buffers.size(), "");
    idx_ = {"i"};
    line("long long first = start;");
    if (vec_ > 1) {
      open("if (" + vector_condition("") + ") {");
      line("const long long vend = start + (end - start) / " + V + " * " + V + ";");
      open("for (long long i = start + (long long)threadIdx.x * " + V + "; i < vend; i += (long long)blockDim.x * " + V + ") {");
      for (size_t i = 0; i < k_.buffers.size(); ++i) o_zero_(i);
      vector_accesses(loaded_by(body), k_.stores, "o", "i");
      idx_ = {"(i + j)"};
      line("#pragma unroll");
      open("for (int j = 0; j < " + V + "; ++j) {");
      for (int id : body) emit_node(id);
      for (const Store& s : k_.stores) line(store_stmt(s.buffer, s.node));
      close();
      vector_stores(k_.stores, "o", "i");
      close();
      line("first = vend;");
      close();
    }
    idx_ = {"i"};
    open("for (long long i = first + threadIdx.x; i < end; i += blockDim.x) {");
    for (size_t i = 0; i < k_.buffers.size(); ++i)
      if (used_[i]) acc_[i] = b(static_cast<int>(i)) + "[i]";
    for (int id : body) emit_node(id);
    for (const Store& s : k_.stores) line(store_stmt(s.buffer, s.node));
    close();
    close();
    close();
  }
  // MultiTensor vector accesses are at `b<i> + o<i> + i` with o<i> = 0.
  void o_zero_(size_t i) {
    if (used_[i]) line("const long long o" + std::to_string(i) + " = 0;");
  }

  const KernelSpec& k_;
  std::string sym_;
  std::ostringstream os_;
  int indent_ = 0;
  std::vector<bool> element_, invariant_, used_, unit_;
  std::vector<int> level_;
  std::vector<std::string> acc_, idx_;
  std::string I_ = "long long";
  int vec_ = 1;
  bool columns_ = false;  // rendering the kColumns variant of a row reduction
  bool unroll_row_ = false;  // Note [Rows kept in registers]
  std::vector<bool> row_cached_;  // per buffer: its row is in rb<i> (Note [Rows kept in registers])
  int row_chunks_ = 0;            // vectors of the row per lane when unroll_row_
  std::string col_begin_, col_end_;  // kColumnsSplit: this block's column range (empty: every column)
};

}  // namespace

RenderedKernel render_kernel(const KernelSpec& spec, const std::string& symbol) {
  spec.validate();
  return Renderer(coalesce_pointwise(canonicalize(spec)), symbol).run();
}

}  // namespace ingot::codegen::cuda
