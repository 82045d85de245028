// C++ rendering of KernelSpecs (see render_cpp.h for the shape of the generated code).
#include "compile/codegen/cpu/render_cpp.h"

#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "compile/codegen/common/scalar_math.h"
#include "runtime/error.h"

namespace ingot::codegen::cpu {

namespace {

const char* storage_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::bf16: case DType::f16: return "uint16_t";
    case DType::i32: return "int32_t";
    case DType::i64: return "int64_t";
    case DType::b8: return "uint8_t";
  }
  return "?";
}

// The type a value of dtype t is computed in (kernel_spec.h, "Numerics").
const char* compute_type(DType t) {
  switch (t) {
    case DType::f32: case DType::bf16: case DType::f16: return "float";
    case DType::f64: return "double";
    case DType::i32: case DType::i64: return "int64_t";
    case DType::b8: return "bool";
  }
  return "?";
}

// A math builtin for compute type T: __builtin_expf for float, __builtin_exp otherwise. Builtins need no
// header (<cmath> is most of a small unit's compile time) and still vectorize through libmvec.
std::string fn(const std::string& name, const std::string& T) { return "__builtin_" + name + (T == "float" ? "f" : ""); }

std::string sym_str(const SymInt& s) { return s.is_constant() ? std::to_string(s.value) : "s" + std::to_string(s.sym); }

std::string literal(double v, DType t) {
  const std::string ct = compute_type(t);
  if (t == DType::b8) return v != 0 ? "true" : "false";
  if (!is_floating(t)) return "INT64_C(" + std::to_string(static_cast<int64_t>(v)) + ")";
  const bool f = ct == "float";
  // The value in the compute type, rounded once (to nearest even) as the eager kernels' static_cast<float>
  // of a scalar, then written exactly as a hex float. A 17-digit decimal with an f suffix is rounded a
  // second time by the compiler, decimal to float: 1 + 2^-24 became 1 + 2^-23, not 1.
  const double w = f ? static_cast<double>(static_cast<float>(v)) : v;
  if (std::isnan(w)) return f ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")";
  if (std::isinf(w)) return std::string(w < 0 ? "-" : "") + (f ? "__builtin_inff()" : "__builtin_inf()");
  char buf[48];
  std::snprintf(buf, sizeof buf, "%a", w);
  return f ? std::string(buf) + "f" : std::string(buf);
}

// "i * 768", "i", or "" (stride 0).
std::string term(const std::string& var, const SymInt& stride) {
  if (stride.is_constant() && stride.value == 0) return "";
  if (stride.is_constant() && stride.value == 1) return var;
  return var + " * " + sym_str(stride);
}

std::string join_terms(const std::vector<std::string>& ts) {
  std::string s;
  for (const std::string& t : ts) {
    if (t.empty()) continue;
    if (!s.empty()) s += " + ";
    s += t;
  }
  return s.empty() ? "0" : s;
}

// Merges adjacent dims that are contiguous in every buffer (stride[d] == stride[d+1] * size[d+1]) and drops
// constant size-1 dims, so a dense 3-d pointwise kernel becomes one long vectorizable loop. Only for all-
// constant index maps and kernels that never read the Index of a dim (merging would renumber it).
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
  Renderer(const KernelSpec& k, const std::string& symbol) : k_(k), symbol_(symbol) {}

  std::string run() {
    const bool multi = k_.kind == KernelKind::MultiTensor;
    classify();
    header_comment();
    line("extern \"C\" void " + symbol_ + "(void* const* bufs, const int64_t* syms, const double* scalars) {");
    ++indent_;
    line("(void)syms;");
    line("(void)scalars;");
    if (!multi) {
      std::set<int> slots;
      for (const SymInt& d : k_.dims)
        if (!d.is_constant()) slots.insert(d.sym);
      for (const Buffer& b : k_.buffers)
        for (const SymInt& s : b.strides)
          if (!s.is_constant()) slots.insert(s.sym);
      for (int s : slots) line("const int64_t s" + std::to_string(s) + " = syms[" + std::to_string(s) + "];");
      for (size_t d = 0; d < k_.dims.size(); ++d)
        line("const int64_t n" + std::to_string(d) + " = " + sym_str(k_.dims[d]) + ";");
      declare_buffers("bufs[", "]");
    }
    for (size_t i = 0; i < k_.nodes.size(); ++i)
      if (invariant_[i]) emit_node(static_cast<int>(i));
    switch (k_.kind) {
      case KernelKind::Pointwise: pointwise(); break;
      case KernelKind::RowReduction: row_reduction(); break;
      case KernelKind::MultiTensor: multi_tensor(); break;
    }
    --indent_;
    line("}");
    return os_.str();
  }

 private:
  void line(const std::string& s) { os_ << std::string(2 * indent_, ' ') << s << '\n'; }
  std::string v(int id) const { return "v" + std::to_string(id); }
  // Node `id` converted to compute dtype `t`.
  std::string as(int id, DType t) const {
    const DType from = k_.nodes[id].dtype;
    if (std::string(compute_type(from)) == compute_type(t)) return v(id);
    if (t == DType::b8) return "(" + v(id) + " != 0)";
    return std::string("static_cast<") + compute_type(t) + ">(" + v(id) + ")";
  }

  void header_comment() {
    static const char* kinds[] = {"pointwise", "row reduction", "multi-tensor"};
    std::string dims;
    for (const SymInt& d : k_.dims) dims += (dims.empty() ? "" : ", ") + sym_str(d);
    line("// " + (k_.name.empty() ? std::string("kernel") : k_.name) + ": " + kinds[static_cast<int>(k_.kind)] +
         (k_.kind == KernelKind::MultiTensor ? "" : " over [" + dims + "]"));
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
      const Buffer& buf = k_.buffers[b];
      std::string st;
      for (const SymInt& s : buf.strides) st += (st.empty() ? "" : ", ") + sym_str(s);
      line("//   b" + std::to_string(b) + (buf.is_output ? " out " : " in  ") + std::string(dtype_name(buf.dtype)) +
           (k_.kind == KernelKind::MultiTensor ? "" : " strides [" + st + "]") +
           (buf.alias_of >= 0 ? " (in place on b" + std::to_string(buf.alias_of) + ")" : "") +
           (buf.name.empty() ? "" : "  " + buf.name));
    }
  }

  void declare_buffers(const std::string& pre, const std::string& post) {
    std::vector<bool> aliased(k_.buffers.size(), false);
    for (size_t b = 0; b < k_.buffers.size(); ++b)
      if (k_.buffers[b].alias_of >= 0) aliased[b] = aliased[k_.buffers[b].alias_of] = true;
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
      const Buffer& buf = k_.buffers[b];
      const std::string ty = std::string(buf.is_output ? "" : "const ") + storage_type(buf.dtype) + "*";
      // In-place pairs read and write the same element at the same point: no restrict, but `omp simd` still
      // vectorizes (each lane loads its element before storing it).
      line(ty + (aliased[b] ? " " : " __restrict__ ") + "b" + std::to_string(b) + " = static_cast<" + ty + ">(" +
           pre + std::to_string(b) + post + ");");
    }
  }

  // invariant: depends on constants and scalars only (hoisted to the top); element: depends on the last dim.
  void classify() {
    const size_t n = k_.nodes.size();
    element_ = element_level_nodes(k_);
    invariant_.assign(n, false);
    level_.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
      const Node& nd = k_.nodes[i];
      if (nd.op == Op::Const || nd.op == Op::Scalar) {
        invariant_[i] = true;
        continue;
      }
      if (nd.op == Op::Load || nd.op == Op::Index) continue;
      bool inv = !is_reduction(nd.op);
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

  std::string load(int b, const std::string& inner_var) const {
    const Buffer& buf = k_.buffers[b];
    std::string idx;
    if (k_.kind == KernelKind::MultiTensor) {
      idx = inner_var;
    } else {
      const std::string t = buf.strides.empty() ? "" : term(inner_var, buf.strides.back());
      idx = k_.dims.size() > 1 ? "r" + std::to_string(b) + (t.empty() ? "" : " + " + t) : (t.empty() ? "0" : t);
    }
    const std::string x = "b" + std::to_string(b) + "[" + idx + "]";
    switch (buf.dtype) {
      case DType::bf16: return "ig_ld_bf16(" + x + ")";
      case DType::f16: return "ig_ld_f16(" + x + ")";
      case DType::b8: return "(" + x + " != 0)";
      case DType::i32: return "static_cast<int64_t>(" + x + ")";
      default: return x;
    }
  }

  std::string store_stmt(int b, int node, const std::string& inner_var) const {
    const Buffer& buf = k_.buffers[b];
    std::string idx;
    if (k_.kind == KernelKind::MultiTensor) {
      idx = inner_var;
    } else {
      const std::string t = inner_var.empty() || buf.strides.empty() ? "" : term(inner_var, buf.strides.back());
      idx = k_.dims.size() > 1 ? "r" + std::to_string(b) + (t.empty() ? "" : " + " + t) : (t.empty() ? "0" : t);
    }
    const std::string val = as(node, buf.dtype);
    std::string rhs;
    switch (buf.dtype) {
      case DType::bf16: rhs = "ig_st_bf16(" + val + ")"; break;
      case DType::f16: rhs = "ig_st_f16(" + val + ")"; break;
      default: rhs = std::string("static_cast<") + storage_type(buf.dtype) + ">(" + val + ")"; break;
    }
    return "b" + std::to_string(b) + "[" + idx + "] = " + rhs + ";";
  }

  std::string unary_expr(const Node& n) const {
    const DType t = n.dtype;
    const std::string a = as(n.a, t), T = compute_type(t);
    const std::string one = "static_cast<" + T + ">(1)";
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
      case Op::Sign: return "static_cast<" + T + ">((" + a + " > 0) - (" + a + " < 0))";
      case Op::Floor: return fn("floor", T) + "(" + a + ")";
      case Op::Not: return "!" + as(n.a, DType::b8);
      case Op::Cast: {
        // Narrowing to bf16/f16 rounds (the eager round trip); everything else is a C++ conversion.
        if (t == DType::bf16) return "ig_round_bf16(" + as(n.a, DType::f32) + ")";
        if (t == DType::f16) return "ig_round_f16(" + as(n.a, DType::f32) + ")";
        return a;
      }
      default: break;
    }
    INGOT_INTERNAL_CHECK(false, "render_cpp: unary op ", op_name(n.op));
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
      case Op::Pow: return "static_cast<" + T + ">(" + fn("pow", T) + "(" + x + ", " + y + "))";
      case Op::Max: return "(" + x + " != " + x + " || " + x + " > " + y + ") ? " + x + " : " + y;
      case Op::Min: return "(" + x + " != " + x + " || " + x + " < " + y + ") ? " + x + " : " + y;
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
    INGOT_INTERNAL_CHECK(false, "render_cpp: binary op ", op_name(n.op));
    return {};
  }

  // Emits `const T vN = ...;` for a non-reduction node; loads use `inner_var` as the innermost index.
  void emit_node(int id, const std::string& inner_var = "") {
    const Node& n = k_.nodes[id];
    const std::string T = compute_type(n.dtype);
    std::string rhs;
    switch (n.op) {
      case Op::Load: rhs = load(n.arg, inner_var); break;
      case Op::Const: rhs = literal(n.value, n.dtype); break;
      case Op::Scalar: rhs = "static_cast<" + T + ">(scalars[" + std::to_string(n.arg) + "])"; break;
      case Op::Index: {
        const bool inner = k_.kind == KernelKind::MultiTensor || n.arg + 1 == static_cast<int>(k_.dims.size());
        rhs = inner ? inner_var : "i" + std::to_string(n.arg);
        break;
      }
      case Op::Where:
        rhs = as(n.a, DType::b8) + " ? " + as(n.b, n.dtype) + " : " + as(n.c, n.dtype);
        break;
      default: rhs = is_binary(n.op) ? binary_expr(n) : unary_expr(n); break;
    }
    line("const " + T + " " + v(id) + " = " + rhs + ";");
  }

  // Element-level nodes that `roots` need, in topological order (row-level operands are already defined).
  std::vector<int> element_closure(const std::vector<int>& roots) const {
    std::vector<bool> need(k_.nodes.size(), false);
    for (int r : roots) need[r] = true;
    for (size_t i = k_.nodes.size(); i-- > 0;) {
      if (!need[i] || !element_[i] || is_reduction(k_.nodes[i].op)) continue;
      for (int o : {k_.nodes[i].a, k_.nodes[i].b, k_.nodes[i].c})
        if (o >= 0) need[o] = true;
    }
    std::vector<int> out;
    for (size_t i = 0; i < k_.nodes.size(); ++i)
      if (need[i] && element_[i] && !invariant_[i] && !is_reduction(k_.nodes[i].op)) out.push_back(static_cast<int>(i));
    return out;
  }

  // Per-buffer base offsets of one outer point: r<b> = sum over outer dims of i<d> * stride.
  void row_bases(size_t outer_dims) {
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
      std::vector<std::string> ts;
      for (size_t d = 0; d < outer_dims; ++d) ts.push_back(term("i" + std::to_string(d), k_.buffers[b].strides[d]));
      line("const int64_t r" + std::to_string(b) + " = " + join_terms(ts) + ";");
    }
  }

  // Defines `outer`, the number of points of the outer dims (all but the last).
  void outer_count() {
    std::string count;
    for (size_t d = 0; d + 1 < k_.dims.size(); ++d) count += (d ? " * " : "") + std::string("n") + std::to_string(d);
    line("const int64_t outer = " + count + ";");
  }

  // Opens the loop over the outer dims (in parallel unless `serial`) and defines i0..i<nd-2> in it.
  void open_outer_loop(bool serial = false) {
    const size_t outer = k_.dims.size() - 1;
    if (!serial)
      line("#pragma omp parallel for schedule(static) if (outer > 1 && outer * n" + std::to_string(outer) +
           " >= " + std::to_string(kParallelThreshold) + ")");
    line("for (int64_t o = 0; o < outer; ++o) {");
    ++indent_;
    if (outer == 1) {
      line("const int64_t i0 = o;");
    } else {
      line("int64_t rest = o;");
      for (size_t d = outer; d-- > 0;) {
        const std::string nd = "n" + std::to_string(d), id = "i" + std::to_string(d);
        if (d == 0) {
          line("const int64_t " + id + " = rest;");
        } else {
          line("const int64_t " + id + " = rest % " + nd + ";");
          line("rest /= " + nd + ";");
        }
      }
    }
    row_bases(outer);
  }

  void pointwise() {
    const size_t nd = k_.dims.size();
    std::vector<int> body;
    for (size_t i = 0; i < k_.nodes.size(); ++i)
      if (!invariant_[i]) body.push_back(static_cast<int>(i));
    if (nd == 0) {  // a single point
      for (int id : body) emit_node(id, "0");
      for (const Store& s : k_.stores) line(store_stmt(s.buffer, s.node, "0"));
      return;
    }
    const std::string iv = "i" + std::to_string(nd - 1), n = "n" + std::to_string(nd - 1);
    const std::string split_inner =
        "#pragma omp parallel for simd schedule(static) if (" + n + " >= " + std::to_string(kParallelThreshold) + ")";
    auto inner_loop = [&](const std::string& pragma) {
      line(pragma);
      line("for (int64_t " + iv + " = 0; " + iv + " < " + n + "; ++" + iv + ") {");
      ++indent_;
      for (int id : body) emit_node(id, iv);
      for (const Store& s : k_.stores) line(store_stmt(s.buffer, s.node, iv));
      --indent_;
      line("}");
    };
    if (nd == 1) {
      inner_loop(split_inner);
      return;
    }
    // Many rows: threads take rows. Few long rows (a broadcast that kept dims from merging): threads split
    // each row instead, so the cores are not left idle.
    outer_count();
    line("if (outer >= 4 * omp_get_max_threads()) {");
    ++indent_;
    open_outer_loop();
    inner_loop("#pragma omp simd");
    --indent_;
    line("}");
    --indent_;
    line("} else {");
    ++indent_;
    open_outer_loop(/*serial=*/true);
    inner_loop(split_inner);
    --indent_;
    line("}");
    --indent_;
    line("}");
  }

  void row_reduction() {
    const size_t nd = k_.dims.size();
    const std::string iv = "i" + std::to_string(nd - 1), n = "n" + std::to_string(nd - 1);
    // One row (a full reduction, e.g. a loss mean or a gradient norm) has no rows to split over threads:
    // its column loops are split instead, OpenMP combining the per-thread partial reductions.
    const std::string simd = nd == 1 ? "#pragma omp parallel for simd schedule(static) if (" + n +
                                           " >= " + std::to_string(kParallelThreshold) + ")"
                                     : "#pragma omp simd";
    if (nd == 1) {
      line("{  // a single row");
      ++indent_;
    } else {
      outer_count();
      open_outer_loop();
    }
    int max_level = 0;
    for (size_t i = 0; i < k_.nodes.size(); ++i) max_level = std::max(max_level, level_[i]);
    auto emit_row_nodes = [&](int lvl) {
      for (size_t i = 0; i < k_.nodes.size(); ++i)
        if (!invariant_[i] && !element_[i] && !is_reduction(k_.nodes[i].op) && level_[i] == lvl)
          emit_node(static_cast<int>(i));
    };
    emit_row_nodes(0);
    for (int p = 1; p <= max_level; ++p) {
      std::vector<int> reds, operands;
      for (size_t i = 0; i < k_.nodes.size(); ++i)
        if (is_reduction(k_.nodes[i].op) && level_[i] == p) {
          reds.push_back(static_cast<int>(i));
          operands.push_back(k_.nodes[i].a);
        }
      std::string clauses;
      for (int r : reds) {
        const Node& nd_r = k_.nodes[r];
        const std::string T = compute_type(nd_r.dtype), acc = "acc" + std::to_string(r);
        std::string init, op;
        const bool fl = is_floating(nd_r.dtype);
        if (nd_r.op == Op::ReduceSum) {
          init = "0", op = "+";
        } else if (nd_r.op == Op::ReduceMax) {
          init = fl ? "-" + literal(INFINITY, nd_r.dtype) : "INT64_MIN", op = "ig_max";
        } else {
          init = fl ? literal(INFINITY, nd_r.dtype) : "INT64_MAX", op = "ig_min";
        }
        line(T + " " + acc + " = " + init + ";  // " + op_name(nd_r.op));
        clauses += " reduction(" + op + ":" + acc + ")";
      }
      line(simd + clauses);
      line("for (int64_t " + iv + " = 0; " + iv + " < " + n + "; ++" + iv + ") {");
      ++indent_;
      for (int id : element_closure(operands)) emit_node(id, iv);
      for (int r : reds) {
        const Node& nd_r = k_.nodes[r];
        const std::string acc = "acc" + std::to_string(r), x = as(nd_r.a, nd_r.dtype);
        if (nd_r.op == Op::ReduceSum) line(acc + " += " + x + ";");
        else if (nd_r.op == Op::ReduceMax)
          line(acc + " = (" + x + " != " + x + " || " + x + " > " + acc + ") ? " + x + " : " + acc + ";");
        else
          line(acc + " = (" + x + " != " + x + " || " + x + " < " + acc + ") ? " + x + " : " + acc + ";");
      }
      --indent_;
      line("}");
      for (int r : reds) line("const " + std::string(compute_type(k_.nodes[r].dtype)) + " " + v(r) + " = acc" + std::to_string(r) + ";");
      emit_row_nodes(p);
    }
    std::vector<Store> element_stores, row_stores;
    for (const Store& s : k_.stores) {
      const SymInt& cs = k_.buffers[s.buffer].strides.back();
      (cs.is_constant() && cs.value == 0 ? row_stores : element_stores).push_back(s);
    }
    if (!element_stores.empty()) {
      std::vector<int> roots;
      for (const Store& s : element_stores) roots.push_back(s.node);
      line(simd);
      line("for (int64_t " + iv + " = 0; " + iv + " < " + n + "; ++" + iv + ") {");
      ++indent_;
      for (int id : element_closure(roots)) emit_node(id, iv);
      for (const Store& s : element_stores) line(store_stmt(s.buffer, s.node, iv));
      --indent_;
      line("}");
    }
    for (const Store& s : row_stores) line(store_stmt(s.buffer, s.node, ""));
    --indent_;
    line("}");
  }

  void multi_tensor() {
    const std::string nb = std::to_string(k_.buffers.size());
    line("const int64_t num_tensors = syms[0];");
    line("int64_t total = 0;");
    line("for (int64_t t = 0; t < num_tensors; ++t) total += syms[1 + t];");
    line("#pragma omp parallel if (total >= " + std::to_string(kParallelThreshold) + ")");
    line("for (int64_t t = 0; t < num_tensors; ++t) {");
    ++indent_;
    line("const int64_t n = syms[1 + t];");
    declare_buffers("bufs[t * " + nb + " + ", "]");
    line("#pragma omp for simd schedule(static) nowait");
    line("for (int64_t i = 0; i < n; ++i) {");
    ++indent_;
    for (size_t i = 0; i < k_.nodes.size(); ++i)
      if (!invariant_[i]) emit_node(static_cast<int>(i), "i");
    for (const Store& s : k_.stores) line(store_stmt(s.buffer, s.node, "i"));
    --indent_;
    line("}");
    --indent_;
    line("}");
  }

  const KernelSpec& k_;
  std::string symbol_;
  std::ostringstream os_;
  int indent_ = 0;
  std::vector<bool> element_, invariant_;
  std::vector<int> level_;
};

}  // namespace

std::string render_preamble() {
  return R"(// ingot generated kernels: plain C++17 + OpenMP, one extern "C" function per kernel. Math goes through
// compiler builtins; the headers are <stdint.h> and the ops' scalar math, runtime/kernels/scalar_math.h (the
// eager kernels' own formulas), which the codegen writes next to this file.
#include <stdint.h>
#include "ingot_scalar_math.h"

extern "C" int omp_get_max_threads(void);  // from libgomp (omp.h is not needed for one declaration)

#if defined(INGOT_JIT_MVEC) && defined(__x86_64__)
// glibc's libmvec has vector versions of these; declaring them `omp declare simd` (what math.h does only
// under -ffast-math, which we do not use: it assumes no NaN/inf and sets flush-to-zero process-wide) lets
// the loops that call them vectorize.
extern "C" {
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
float expm1f(float);
#pragma omp declare simd notinbranch
float log1pf(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float sinf(float);
#pragma omp declare simd notinbranch
float cosf(float);
#pragma omp declare simd notinbranch
double exp(double);
#pragma omp declare simd notinbranch
double log(double);
#pragma omp declare simd notinbranch
double tanh(double);
#pragma omp declare simd notinbranch
double erf(double);
}
#endif

// Max and min that propagate NaN (as the eager reductions do), also when OpenMP combines lanes and threads;
// the accumulator starts at the identity, so the original value is a valid initializer.
#pragma omp declare reduction(ig_max : float, double, int64_t : \
    omp_out = (omp_in != omp_in || omp_in > omp_out) ? omp_in : omp_out) initializer(omp_priv = omp_orig)
#pragma omp declare reduction(ig_min : float, double, int64_t : \
    omp_out = (omp_in != omp_in || omp_in < omp_out) ? omp_in : omp_out) initializer(omp_priv = omp_orig)

namespace {

// bf16 is the top half of an f32; rounding to nearest even, NaN kept quiet.
inline float ig_ld_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint16_t ig_st_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if (f != f) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float ig_round_bf16(float f) { return ig_ld_bf16(ig_st_bf16(f)); }

#if defined(__FLT16_MAX__)
// The compiler's half type: conversions are exact IEEE (round to nearest even), in hardware with F16C.
inline float ig_ld_f16(uint16_t h) {
  _Float16 x;
  __builtin_memcpy(&x, &h, 2);
  return static_cast<float>(x);
}
inline uint16_t ig_st_f16(float f) {
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  __builtin_memcpy(&h, &x, 2);
  return h;
}
#else
inline float ig_ld_f16(uint16_t h) {
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float mag;
  if (e == 0) {
    mag = static_cast<float>(m) * 5.9604644775390625e-8f;  // subnormal: m * 2^-24, exact
  } else if (e == 31) {
    mag = m ? __builtin_nanf("") : __builtin_inff();
  } else {
    const uint32_t u = ((e + 112u) << 23) | (m << 13);
    __builtin_memcpy(&mag, &u, 4);
  }
  return (h & 0x8000u) ? -mag : mag;
}
inline uint16_t ig_st_f16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = __builtin_fabsf(f);
  if (a != a) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (a < 6.103515625e-5f) return sign | static_cast<uint16_t>(__builtin_nearbyintf(a * 16777216.0f));  // subnormal
  const uint32_t e = ((u >> 23) & 0xffu) - 112u, m = u & 0x7fffffu;
  uint32_t h = (e << 10) | (m >> 13);
  const uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is correct
  return sign | static_cast<uint16_t>(h);
}
#endif
inline float ig_round_f16(float f) { return ig_ld_f16(ig_st_f16(f)); }

}  // namespace
)";
}

const std::string& renderer_fingerprint() {
  static const std::string fp = [] {
    std::string text = render_preamble() + scalar_math_source();
    // Pointwise: every unary and binary op, where, casts to the narrow types, indices, scalars, constants.
    KernelSpec pw;
    pw.name = "probe_pointwise";
    pw.dims = {SymInt::slot(0), SymInt::constant(3)};
    pw.num_syms = 1;
    const int x = pw.load(pw.input(DType::f32, {SymInt::constant(3), SymInt::constant(1)}));
    const int z = pw.load(pw.input(DType::f64, {SymInt::constant(0), SymInt::constant(1)}));
    const int i = pw.load(pw.input(DType::i32, {SymInt::constant(3), SymInt::constant(1)}));
    int acc = pw.binary(Op::Add, pw.scalar(0, DType::f32), pw.constant(-INFINITY, DType::f32));
    acc = pw.binary(Op::Add, acc, pw.constant(0.1, DType::f32));  // how finite constants are written
    for (int op = static_cast<int>(Op::Neg); op < static_cast<int>(Op::Cast); ++op)
      acc = pw.binary(Op::Add, acc, pw.unary(static_cast<Op>(op), x));
    for (int op = static_cast<int>(Op::Add); op <= static_cast<int>(Op::GeluErfGrad); ++op)
      acc = pw.where(pw.cast(pw.binary(static_cast<Op>(op), x, z), DType::b8), acc, pw.cast(i, DType::f32));
    acc = pw.binary(Op::Add, acc, pw.cast(pw.index(0), DType::f32));
    pw.store(pw.output(DType::bf16, {SymInt::constant(3), SymInt::constant(1)}), pw.cast(acc, DType::f16));
    pw.store(pw.output(DType::b8, {SymInt::constant(3), SymInt::constant(1)}), pw.cast(acc, DType::b8));
    text += render_kernel(pw, "p0");
    // Row reduction: two phases, row and element outputs, every reduction.
    KernelSpec rr;
    rr.kind = KernelKind::RowReduction;
    rr.name = "probe_rows";
    rr.dims = {SymInt::constant(2), SymInt::constant(5)};
    const int rx = rr.load(rr.input(DType::bf16, rr.contiguous_strides()));
    const int m = rr.reduce(Op::ReduceMax, rx);
    const int s = rr.reduce(Op::ReduceSum, rr.binary(Op::Sub, rx, m));
    rr.store(rr.output(DType::f32, {SymInt::constant(1), SymInt::constant(0)}),
             rr.binary(Op::Add, s, rr.reduce(Op::ReduceMin, rx)));
    rr.store(rr.output(DType::f32, rr.contiguous_strides()), rr.binary(Op::Div, rx, s));
    text += render_kernel(rr, "p1");
    KernelSpec one = rr;
    one.name = "probe_one_row";
    one.dims = {SymInt::constant(5)};
    for (Buffer& b : one.buffers) b.strides.erase(b.strides.begin());
    text += render_kernel(one, "p2");
    // Multi-tensor, in place.
    KernelSpec mt;
    mt.kind = KernelKind::MultiTensor;
    mt.name = "probe_multi";
    const int p = mt.input(DType::f32, {});
    mt.store(mt.output(DType::f32, {}, "", p), mt.binary(Op::Mul, mt.load(p), mt.scalar(0, DType::f32)));
    text += render_kernel(mt, "p3");
    uint64_t h = 1469598103934665603ull;
    for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
    char buf[32];
    std::snprintf(buf, sizeof buf, "renderer-%016llx", static_cast<unsigned long long>(h));
    return std::string(buf);
  }();
  return fp;
}

std::string render_kernel(const KernelSpec& spec, const std::string& symbol) {
  spec.validate();
  for (const Node& n : spec.nodes)
    INGOT_CHECK(n.op != Op::ColumnSum, "[codegen] kernel '", spec.name,
                "': column sums are generated for CUDA only (Note [Column sums in row reductions])");
  return Renderer(coalesce_pointwise(canonicalize(spec)), symbol).run();
}

}  // namespace ingot::codegen::cpu
