// C++ rendering of KernelSpecs (see render_cpp.h for the shape of the generated code): the language over the
// printer core, the loops over the outer dims, and render_kernel(); the kernel kinds are render_cpp_pointwise.cpp,
// render_cpp_rows.cpp and render_cpp_multi_tensor.cpp.
#include "compile/codegen/cpu/render_cpp.h"

#include <set>

#include "compile/codegen/cpu/render_cpp_core.h"
#include "runtime/error.h"

namespace ingot::codegen::cpu {
namespace detail {
namespace {

// "i * 768", "i", or "" (stride 0).
std::string term(const std::string& var, const SymInt& stride) {
  if (is_const(stride, 0)) return "";
  if (is_const(stride, 1)) return var;
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

}  // namespace

const char* Renderer::storage_type(DType t) const {
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
const char* Renderer::compute_type(DType t) const {
  switch (t) {
    case DType::f32: case DType::bf16: case DType::f16: return "float";
    case DType::f64: return "double";
    case DType::i32: case DType::i64: return "int64_t";
    case DType::b8: return "bool";
  }
  return "?";
}

std::string Renderer::cast(const std::string& T, const std::string& x) const { return "static_cast<" + T + ">(" + x + ")"; }

// A math builtin for compute type T: __builtin_expf for float, __builtin_exp otherwise. Builtins need no
// header (<cmath> is most of a small unit's compile time) and still vectorize through libmvec.
std::string Renderer::math(const std::string& name, const std::string& T) const {
  return "__builtin_" + name + (T == "float" ? "f" : "");
}

std::string Renderer::pow_expr(const Node& n, const std::string& x, const std::string& y) const {
  const std::string T = compute_type(n.dtype);
  return cast(T, math("pow", T) + "(" + x + ", " + y + ")");
}

std::string Renderer::max_expr(const std::string& x, const std::string& y) const {
  return "(" + x + " != " + x + " || " + x + " > " + y + ") ? " + x + " : " + y;
}

std::string Renderer::min_expr(const std::string& x, const std::string& y) const {
  return "(" + x + " != " + x + " || " + x + " < " + y + ") ? " + x + " : " + y;
}

// b<i>[r<i> + inner * stride]: r<i> is the buffer's offset of the outer point (row_bases); a MultiTensor buffer
// is dense, indexed by the loop variable alone.
std::string Renderer::access(int buf) const {
  const Buffer& b = k_.buffers[static_cast<size_t>(buf)];
  std::string idx;
  if (k_.kind == KernelKind::MultiTensor) {
    idx = inner_;
  } else {
    const std::string t = inner_.empty() || b.strides.empty() ? "" : term(inner_, b.strides.back());
    idx = k_.dims.size() > 1 ? numbered("r", buf) + (t.empty() ? "" : " + " + t) : (t.empty() ? "0" : t);
  }
  return numbered("b", buf) + "[" + idx + "]";
}

std::string Renderer::scalar_expr(const Node& n) const {
  return cast(compute_type(n.dtype), "scalars[" + std::to_string(n.arg) + "]");
}

std::string Renderer::index_expr(const Node& n) const {
  const bool inner = k_.kind == KernelKind::MultiTensor || n.arg + 1 == static_cast<int>(k_.dims.size());
  return inner ? inner_ : numbered("i", n.arg);
}

std::string Renderer::run() {
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
    declare_buffers([](int i) { return "bufs[" + std::to_string(i) + "]"; }, /*used_only=*/false);
  }
  for (size_t i = 0; i < k_.nodes.size(); ++i)
    if (invariant_[i]) emit_at(static_cast<int>(i), "");
  switch (k_.kind) {
    case KernelKind::Pointwise: pointwise(); break;
    case KernelKind::RowReduction: row_reduction(); break;
    case KernelKind::MultiTensor: multi_tensor(); break;
  }
  --indent_;
  line("}");
  return os_.str();
}

// Per-buffer base offsets of one outer point: r<b> = sum over outer dims of i<d> * stride.
void Renderer::row_bases(size_t outer_dims) {
  for (size_t b = 0; b < k_.buffers.size(); ++b) {
    std::vector<std::string> ts;
    for (size_t d = 0; d < outer_dims; ++d) ts.push_back(term(numbered("i", static_cast<int64_t>(d)), k_.buffers[b].strides[d]));
    line("const int64_t r" + std::to_string(b) + " = " + join_terms(ts) + ";");
  }
}

// Defines `outer`, the number of points of the outer dims (all but the last).
void Renderer::outer_count() {
  std::string count;
  for (size_t d = 0; d + 1 < k_.dims.size(); ++d) count += (d ? " * " : "") + std::string("n") + std::to_string(d);
  line("const int64_t outer = " + count + ";");
}

// Opens the loop over the outer dims (in parallel unless `serial`) and defines i0..i<nd-2> in it.
void Renderer::open_outer_loop(bool serial) {
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
      const std::string nd = numbered("n", static_cast<int64_t>(d)), id = numbered("i", static_cast<int64_t>(d));
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

}  // namespace detail

std::string render_kernel(const KernelSpec& spec, const std::string& symbol) {
  spec.validate();
  for (const Node& n : spec.nodes)
    INGOT_CHECK(n.op != Op::ColumnSum, "[codegen] kernel '", spec.name,
                "': column sums are generated for CUDA only (Note [Column sums in row reductions])");
  return detail::Renderer(coalesce_pointwise(canonicalize(spec)), symbol).run();
}

}  // namespace ingot::codegen::cpu
