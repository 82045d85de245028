// The printer core of the code generators: what the C++ renderer (codegen/cpu/render_cpp*.cpp) and the CUDA
// renderer (codegen/cuda/render_cuda*.cpp) print alike. A renderer derives from PrinterCore and says through its
// hooks how its language spells types, casts, math functions, literals, scalars, indices and the buffer element
// at the current point; the core classifies the spec's nodes, plans a row reduction's phases before anything is
// printed (RowPhases), and prints expressions, node definitions, buffer pointers and the header comment.
#pragma once

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "compile/codegen/common/kernel_spec.h"

namespace ingot::codegen {

// `prefix` followed by `i` ("v12", "n0"). Built with append(): GCC 12 warns (-Wrestrict) on an inlined
// "v" + std::to_string(i) (its bug 105329).
inline std::string numbered(const char* prefix, int64_t i) { return std::string(prefix).append(std::to_string(i)); }
// A size or stride as code: its constant, or the sym slot s<k>.
std::string sym_str(const SymInt& s);
bool is_const(const SymInt& s, int64_t v);

// Merges adjacent dims that are contiguous in every buffer (stride[d] == stride[d+1] * size[d+1]) and drops
// constant size-1 dims, so a dense n-d pointwise kernel is one long loop (fewer divisions per point, longer
// vector runs). Only for all-constant index maps and kernels that never read the Index of a dim (merging would
// renumber it); other kernels are returned unchanged.
KernelSpec coalesce_pointwise(KernelSpec k);

// A row reduction's structure, decided before printing. Phase 0 holds the row-level nodes that need no
// reduction; phase p >= 1 reduces the nodes of reduction level p (softmax: max, then sum) over a column loop
// that computes `closure` (the element-level nodes their operands need), then defines the row-level nodes of
// level p. After the phases one column loop computes `epilogue` and writes the element stores (and adds the
// column sums); row stores are written once per row.
struct RowPhases {
  struct Phase {
    std::vector<int> reductions;  // the reduction nodes of this level, in node order (none in phase 0)
    std::vector<int> closure;     // element-level nodes their operands need, in topological order
    std::vector<int> row_nodes;   // row-level nodes of this level, defined after the reductions
  };
  std::vector<Phase> phases;
  std::vector<int> reductions;  // every reduction node, in node order
  std::vector<Store> element_stores, row_stores, column_sums;
  std::vector<int> epilogue;  // element-level nodes the element stores and column sums need
};

class PrinterCore {
 protected:
  explicit PrinterCore(const KernelSpec& k) : k_(k) {}
  virtual ~PrinterCore() = default;

  // The language.
  virtual const char* storage_type(DType t) const = 0;  // the C++ type a buffer of dtype t holds
  virtual const char* compute_type(DType t) const = 0;  // the type a value of dtype t is computed in
  virtual std::string cast(const std::string& T, const std::string& x) const = 0;
  virtual std::string one(const std::string& T) const = 0;  // 1 in type T
  // The math function `name` for compute type T (exp: expf for float, exp for double).
  virtual std::string math(const std::string& name, const std::string& T) const = 0;
  virtual std::string int_literal(int64_t v) const = 0;
  virtual std::string nan_literal(bool f32) const = 0;
  virtual std::string inf_literal(bool f32) const = 0;
  virtual std::string float_literal(const std::string& hex, bool f32) const = 0;  // from printf's %a
  virtual std::string pow_expr(const Node& n, const std::string& x, const std::string& y) const = 0;
  virtual std::string max_expr(const std::string& x, const std::string& y) const = 0;  // NaN-propagating
  virtual std::string min_expr(const std::string& x, const std::string& y) const = 0;
  // x * y for a Mul node of compute type T (a renderer may keep it from fusing into an FMA).
  virtual std::string mul_expr(const std::string& T, const std::string& x, const std::string& y) const {
    (void)T;
    return x + " * " + y;
  }
  // The current point.
  virtual std::string access(int buf) const = 0;  // buffer `buf`'s element there
  virtual std::string scalar_expr(const Node& n) const = 0;
  virtual std::string index_expr(const Node& n) const = 0;
  virtual std::string header_suffix() const { return ""; }  // after the header comment's first line

  void line(const std::string& s) { os_ << std::string(static_cast<size_t>(2 * indent_), ' ') << s << '\n'; }
  void open(const std::string& s);
  void close(const std::string& s = "}");
  std::string v(int id) const { return numbered("v", id); }

  // A literal of v in t's compute type.
  std::string literal(double v, DType t) const;
  // Node `id` converted to compute dtype `t`.
  std::string as(int id, DType t) const;

  void header_comment();
  // Which nodes are invariant (constants and scalars only: hoisted to the top), element level, and in which
  // reduction phase; which buffers the kernel reads or writes.
  void classify();
  RowPhases plan_rows() const;
  // Typed pointers b<i> = src(i) to the buffers (with `used_only`, those the kernel reads or writes).
  void declare_buffers(const std::function<std::string(int)>& src, bool used_only);

  std::string load_expr(int buf) const;
  std::string store_stmt(int buf, int node) const;
  virtual std::string unary_expr(const Node& n) const;
  std::string unary_math(const Node& n, const std::string& a, const std::string& T) const;
  std::string binary_expr(const Node& n) const;
  // `const T vN = ...;` for a non-reduction node.
  void emit_node(int id);
  // Element-level nodes that `roots` need, in topological order (row-level operands are already defined).
  std::vector<int> element_closure(const std::vector<int>& roots) const;

  const KernelSpec& k_;
  std::ostringstream os_;
  int indent_ = 0;
  std::vector<bool> element_, invariant_, used_;
  std::vector<int> level_;
};

}  // namespace ingot::codegen
