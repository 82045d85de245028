// The CUDA renderer's core, shared by its files (internal to compile/codegen/cuda): the Renderer, which prints one
// KernelSpec as CUDA C++ (render_cuda.h says what the generated code looks like), and the scalar helpers.
//   render_cuda.cpp            the shared printer: classification and planning of the spec, parameter structs,
//                              buffers, index arithmetic, expressions, vector accesses; render_kernel()
//   render_cuda_pointwise.cpp  Pointwise and MultiTensor kernels
//   render_cuda_rows.cpp       RowReduction kernels (warp / block / column variants, column sums, split columns)
#pragma once

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "compile/codegen/cuda/render_cuda.h"

namespace ingot::codegen::cuda::detail {

// The C++ type that stores / computes values of dtype t; a literal of v in t's compute type.
const char* storage_type(DType t);
const char* compute_type(DType t);
std::string literal(double v, DType t);
// CUDA's math function `name` for compute type T (expf for float, exp for double).
std::string fn(const std::string& name, const std::string& T);
// A size or stride as code: its constant, or the sym slot s<k>.
std::string sym_str(const SymInt& s);
bool is_const(const SymInt& s, int64_t v);
// The identity and the functor of a reduction node.
std::string reduce_identity(const Node& n);
const char* reduce_functor(Op op);

class Renderer {
 public:
  Renderer(const KernelSpec& k, const std::string& symbol) : k_(k), sym_(symbol) {}

  RenderedKernel run();

 private:
  // kWarp: one warp per row; kBlock: one block per row; kColumns: threadIdx.x picks the row (consecutive
  // lanes, consecutive rows), threadIdx.y splits its columns, partials combined through shared memory.
  enum Variant { kWarp, kBlock, kColumns, kColumnsSplit };
  // What a row-reduction function is, decided before any of it is printed (plan_row, render_cuda_rows.cpp) and
  // read by every helper that prints part of it; the default plan outside row reductions.
  struct RowPlan {
    Variant variant = kWarp;
    bool columns = false;      // kColumns / kColumnsSplit: threadIdx.x picks the row
    bool unroll = false;       // the row kept in registers (Note [Rows kept in registers])
    std::vector<bool> cached;  // per buffer: its row is in rb<i>
    int chunks = 0;            // vectors of the row per lane when unroll
  };

  void line(const std::string& s) { os_ << std::string(2 * indent_, ' ') << s << '\n'; }
  void open(const std::string& s);
  void close(const std::string& s = "}");
  // append(), not "v" + to_string(): GCC 12 warns (-Wrestrict) on the inlined operator+ here (its bug 105329).
  std::string v(int id) const { return std::string("v").append(std::to_string(id)); }
  std::string b(int id) const { return std::string("b").append(std::to_string(id)); }
  int last() const { return static_cast<int>(k_.dims.size()) - 1; }

  std::string as(int id, DType t) const;

  // Planning (render_cuda.cpp): which nodes are element / row level, vector width, index type, variants.
  void header_comment();
  void classify();
  void plan();
  void params_struct();
  bool splittable() const;

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

  // Printing shared by every kind (render_cuda.cpp).
  void prologue();
  std::string vector_condition(const std::string& inner_size) const;
  std::string load_expr(int buf) const;
  std::string store_stmt(int buf, int node) const;
  std::string unary_expr(const Node& n) const;
  std::string unary_math(const Node& n, const std::string& a, const std::string& T) const;
  std::string binary_expr(const Node& n) const;
  void emit_node(int id);
  std::vector<int> element_closure(const std::vector<int>& roots) const;
  void decompose(const std::string& lin, int upto, const std::string& inner_div, const std::string& inner_scale);
  void offsets(const std::string& prefix, int upto);
  // Vector loads of the unit-stride input buffers in `bufs` at offset `base + off`; declares vo<b> for the
  // unit-stride outputs in `outs`. Sets acc_ to the per-lane elements.
  void vector_accesses(const std::set<int>& bufs, const std::vector<Store>& outs, const std::string& base,
                       const std::string& off) {
    const std::string V = std::to_string(vec_);
    for (int i : bufs) {
      const std::string at = b(i) + " + " + base + std::to_string(i) + (off.empty() ? "" : " + " + off);
      if (row_.unroll && row_.cached[static_cast<size_t>(i)]) {  // Note [Rows kept in registers]
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
  void vector_stores(const std::vector<Store>& outs, const std::string& base, const std::string& off);
  std::set<int> loaded_by(const std::vector<int>& nodes) const;

  // Pointwise and MultiTensor kernels (render_cuda_pointwise.cpp).
  void pointwise();
  void multi_tensor();
  void o_zero_(size_t i);

  // RowReduction kernels (render_cuda_rows.cpp).
  template <typename Body>
  void column_loop(const std::vector<int>& closure, const std::vector<Store>& outs, Body body);
  bool element_buffer(size_t i) const { return !is_const(k_.buffers[i].strides[last()], 0); }
  std::string col_stride(size_t i) const;
  void point_row();
  bool prefer_columns() const;
  RowPlan plan_row(Variant variant) const;
  void row_reduction(Variant variant);
  void open_row_chunks();
  void load_row();
  std::vector<Store> column_sums() const;
  std::string padded(const std::string& c) const;
  void column_sum_setup(size_t count);
  void column_sum_partials(size_t count);
  void column_finish();
  void split_combine(const std::vector<int>& reds);

  const KernelSpec& k_;
  std::string sym_;
  std::ostringstream os_;
  int indent_ = 0;
  std::vector<bool> element_, invariant_, used_, unit_;
  std::vector<int> level_;
  std::vector<std::string> acc_, idx_;
  std::string I_ = "long long";
  int vec_ = 1;
  RowPlan row_;  // the row-reduction function being printed (default: none)
  std::string col_begin_, col_end_;  // kColumnsSplit: this block's column range (empty: every column)
};

}  // namespace ingot::codegen::cuda::detail
