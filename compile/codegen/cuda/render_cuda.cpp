// CUDA rendering of KernelSpecs (see render_cuda.h for the shape of the generated code): the language over the
// printer core, the planning and printing every kind shares, and render_kernel(); the kernel kinds are
// render_cuda_pointwise.cpp, render_cuda_rows.cpp and render_cuda_multi_tensor.cpp.
#include "compile/codegen/cuda/render_cuda.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "compile/codegen/cuda/render_cuda_core.h"
#include "runtime/error.h"

namespace ingot::codegen::cuda {
namespace detail {

const char* Renderer::storage_type(DType t) const {
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
const char* Renderer::compute_type(DType t) const {
  switch (t) {
    case DType::f32: case DType::bf16: case DType::f16: return "float";
    case DType::f64: return "double";
    case DType::i32: case DType::i64: return "long long";
    case DType::b8: return "bool";
  }
  return "?";
}

// CUDA's math functions: expf for float, exp for double.
std::string Renderer::math(const std::string& name, const std::string& T) const { return T == "float" ? name + "f" : name; }

std::string Renderer::int_literal(int64_t v) const {
  if (v == INT64_MIN) return "(-9223372036854775807LL - 1)";
  return "(" + std::to_string(v) + "LL)";
}

std::string Renderer::nan_literal(bool f32) const {
  return f32 ? "__int_as_float(0x7fc00000)" : "__longlong_as_double(0x7ff8000000000000LL)";
}

std::string Renderer::inf_literal(bool f32) const {
  return f32 ? "__int_as_float(0x7f800000)" : "__longlong_as_double(0x7ff0000000000000LL)";
}

std::string Renderer::float_literal(const std::string& hex, bool f32) const {
  return f32 ? "(" + hex + "f)" : "(" + hex + ")";
}

std::string Renderer::pow_expr(const Node& n, const std::string& x, const std::string& y) const {
  if (!is_floating(n.dtype)) return "(long long)pow((double)" + x + ", (double)" + y + ")";
  const std::string T = compute_type(n.dtype);
  return "(" + T + ")" + math("pow", T) + "(" + x + ", " + y + ")";
}

std::string Renderer::scalar_expr(const Node& n) const {
  const std::string i = std::to_string(n.arg), T = compute_type(n.dtype);
  // A multi-tensor kernel may read its scalars from device memory (p.cs, Note [Scalars read from the device],
  // compile/exec/graph_replay.h); its scalar nodes are loop invariants, read once per thread.
  if (k_.kind == KernelKind::MultiTensor) return "(" + T + ")(p.cs ? p.cs[" + i + "] : p.c[" + i + "])";
  return "(" + T + ")p.c[" + i + "]";
}

std::string Renderer::index_expr(const Node& n) const { return "(long long)(" + idx_.at(static_cast<size_t>(n.arg)) + ")"; }

std::string Renderer::header_suffix() const { return ", vector width " + std::to_string(vec_) + ", " + I_ + " indices"; }

std::string Renderer::unary_expr(const Node& n) const {
  // Math on integers goes through double (CUDA's math functions have no integer overloads).
  const bool int_math = !is_floating(n.dtype) && n.op != Op::Neg && n.op != Op::Abs && n.op != Op::Square &&
                        n.op != Op::Relu && n.op != Op::Sign && n.op != Op::Not && n.op != Op::Cast;
  if (!int_math) return PrinterCore::unary_expr(n);
  Node d = n;
  d.dtype = DType::f64;
  return "(long long)(" + unary_math(d, "(double)" + v(n.a), "double") + ")";
}

// What a reduction node starts from, in its compute type, and the preamble functor that combines two partials.
std::string Renderer::reduce_identity(const Node& n) const {
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
      if (const size_t sums = phases_.column_sums.size(); sums > 0) {  // Note [Column sums in row reductions]
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
        out.abi.split_reductions = static_cast<int>(phases_.reductions.size());
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

// Index width, vector plan and the row phases. The vector path needs every used buffer's innermost stride to be
// the constant 0 or 1 (1 for outputs) and constant outer strides of unit-stride buffers to be multiples of the
// width; what is only known at run time (sizes, pointers, symbolic strides) is checked by the kernel.
void Renderer::plan() {
  I_ = "long long";
  vec_ = 1;
  if (k_.kind == KernelKind::RowReduction) phases_ = plan_rows();
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
  declare_buffers([](int i) { return "p.b[" + std::to_string(i) + "]"; }, /*used_only=*/true);
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

void Renderer::vector_accesses(const std::set<int>& bufs, const std::vector<Store>& outs, const std::string& base,
                               const std::string& off) {
  const std::string V = std::to_string(vec_);
  for (int i : bufs) {
    const std::string at = b(i) + " + " + base + std::to_string(i) + (off.empty() ? "" : " + " + off);
    if (row_.unroll && row_.cached[static_cast<size_t>(i)]) {  // Note [Rows kept in registers]
      acc_[static_cast<size_t>(i)] = "rb" + std::to_string(i) + "[k][j]";
      continue;
    }
    if (unit_[static_cast<size_t>(i)] && !k_.buffers[static_cast<size_t>(i)].is_output) {
      line("alignas(16) " + std::string(storage_type(k_.buffers[static_cast<size_t>(i)].dtype)) + " vb" +
           std::to_string(i) + "[" + V + "];");
      line("ig_ldv<" + V + ">(vb" + std::to_string(i) + ", " + at + ");");
      acc_[static_cast<size_t>(i)] = "vb" + std::to_string(i) + "[j]";
    }
  }
  for (const Store& s : outs) {
    line("alignas(16) " + std::string(storage_type(k_.buffers[static_cast<size_t>(s.buffer)].dtype)) + " vo" +
         std::to_string(s.buffer) + "[" + V + "];");
    acc_[static_cast<size_t>(s.buffer)] = "vo" + std::to_string(s.buffer) + "[j]";
  }
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

RenderedKernel render_kernel(const KernelSpec& spec, const std::string& symbol) {
  spec.validate();
  return detail::Renderer(coalesce_pointwise(canonicalize(spec)), symbol).run();
}

}  // namespace ingot::codegen::cuda
