// The CUDA renderer's core, shared by its files (internal to compile/codegen/cuda): the Renderer, which prints one
// KernelSpec as CUDA C++ (render_cuda.h says what the generated code looks like) over the printer core the C++
// renderer shares (compile/codegen/common/printer_core.h).
//   render_cuda.cpp               the language (types, casts, literals, accesses), planning of the spec (vector
//                                 width, index type), parameter structs, index arithmetic, vector accesses;
//                                 render_kernel()
//   render_cuda_pointwise.cpp     Pointwise kernels
//   render_cuda_rows.cpp          RowReduction kernels (warp / block / column variants, column sums, split columns)
//   render_cuda_multi_tensor.cpp  MultiTensor kernels
//   render_cuda_preamble.cpp      the preamble and the renderer's fingerprint
#pragma once

#include <set>
#include <string>
#include <vector>

#include "compile/codegen/common/printer_core.h"
#include "compile/codegen/cuda/render_cuda.h"

namespace ingot::codegen::cuda::detail {

// The preamble functor that combines two partials of a reduction node.
const char* reduce_functor(Op op);

class Renderer : public PrinterCore {
 public:
  Renderer(const KernelSpec& k, const std::string& symbol) : PrinterCore(k), sym_(symbol) {}

  RenderedKernel run();

 private:
  // kWarp: one warp per row; kBlock: one block per row; kColumns: threadIdx.x picks the row (consecutive
  // lanes, consecutive rows), threadIdx.y splits its columns, partials combined through shared memory.
  enum Variant { kWarp, kBlock, kColumns, kColumnsSplit };
  // What a row-reduction function is, decided before any of it is printed (plan_row, render_cuda_rows.cpp) and
  // read by every helper that prints part of it; the default plan outside row reductions. Its phases, the same
  // for every variant and for the C++ renderer, are the spec's RowPhases (phases_).
  struct RowPlan {
    Variant variant = kWarp;
    bool columns = false;      // kColumns / kColumnsSplit: threadIdx.x picks the row
    bool unroll = false;       // the row kept in registers (Note [Rows kept in registers])
    std::vector<bool> cached;  // per buffer: its row is in rb<i>
    int chunks = 0;            // vectors of the row per lane when unroll
  };

  // The language (render_cuda.cpp).
  const char* storage_type(DType t) const override;
  const char* compute_type(DType t) const override;
  std::string cast(const std::string& T, const std::string& x) const override { return "(" + T + ")(" + x + ")"; }
  std::string one(const std::string& T) const override { return "(" + T + ")1"; }
  std::string math(const std::string& name, const std::string& T) const override;
  std::string int_literal(int64_t v) const override;
  std::string nan_literal(bool f32) const override;
  std::string inf_literal(bool f32) const override;
  std::string float_literal(const std::string& hex, bool f32) const override;
  std::string pow_expr(const Node& n, const std::string& x, const std::string& y) const override;
  std::string max_expr(const std::string& x, const std::string& y) const override { return "ig_max(" + x + ", " + y + ")"; }
  std::string min_expr(const std::string& x, const std::string& y) const override { return "ig_min(" + x + ", " + y + ")"; }
  // A multi-tensor (optimizer) kernel rounds every f32 product on its own, as the eager CUDA kernels do with
  // __fmul_rn: NVRTC's --fmad=true would fuse it with the following add, and an update of bf16 weights keys its
  // stochastic rounding on the f32 result's bits (Note [Stochastic rounding], runtime/kernels/scalar_math.h).
  std::string mul_expr(const std::string& T, const std::string& x, const std::string& y) const override {
    if (k_.kind == KernelKind::MultiTensor && T == "float") return "__fmul_rn(" + x + ", " + y + ")";
    return x + " * " + y;
  }
  // acc_[buf]: what the kind's loop set for the current point.
  std::string access(int buf) const override { return acc_[static_cast<size_t>(buf)]; }
  std::string scalar_expr(const Node& n) const override;
  std::string index_expr(const Node& n) const override;
  std::string header_suffix() const override;
  std::string unary_expr(const Node& n) const override;
  // What a reduction node starts from, in its compute type.
  std::string reduce_identity(const Node& n) const;

  std::string b(int id) const { return numbered("b", id); }
  int last() const { return static_cast<int>(k_.dims.size()) - 1; }

  // Planning (render_cuda.cpp): vector width, index type, the row phases.
  void plan();
  void params_struct();
  bool splittable() const;

  // Printing shared by every kind (render_cuda.cpp).
  void prologue();
  std::string vector_condition(const std::string& inner_size) const;
  void decompose(const std::string& lin, int upto, const std::string& inner_div, const std::string& inner_scale);
  void offsets(const std::string& prefix, int upto);
  // Vector loads of the unit-stride input buffers in `bufs` at offset `base + off`; declares vo<b> for the
  // unit-stride outputs in `outs`. Sets acc_ to the per-lane elements.
  void vector_accesses(const std::set<int>& bufs, const std::vector<Store>& outs, const std::string& base,
                       const std::string& off);
  void vector_stores(const std::vector<Store>& outs, const std::string& base, const std::string& off);
  std::set<int> loaded_by(const std::vector<int>& nodes) const;

  void pointwise();     // render_cuda_pointwise.cpp
  void multi_tensor();  // render_cuda_multi_tensor.cpp

  // RowReduction kernels (render_cuda_rows.cpp).
  template <typename Body>
  void column_loop(const std::vector<int>& closure, const std::vector<Store>& outs, Body body);
  bool element_buffer(size_t i) const { return !is_const(k_.buffers[i].strides[static_cast<size_t>(last())], 0); }
  std::string col_stride(size_t i) const;
  void point_row();
  bool prefer_columns() const;
  RowPlan plan_row(Variant variant) const;
  void row_reduction(Variant variant);
  void open_rows(Variant variant);
  void reduce_phase(size_t p, Variant variant);
  void row_outputs();
  void open_row_chunks();
  void load_row();
  std::string padded(const std::string& c) const;
  void column_sum_setup(size_t count);
  void column_sum_partials(size_t count);
  void column_finish();
  void split_combine(const std::vector<int>& reds);

  std::string sym_;
  std::vector<bool> unit_;
  std::vector<std::string> acc_, idx_;
  std::string I_ = "long long";
  int vec_ = 1;
  RowPhases phases_;  // RowReduction: the phases, decided in plan()
  RowPlan row_;       // the row-reduction function being printed (default: none)
  std::string col_begin_, col_end_;  // kColumnsSplit: this block's column range (empty: every column)
};

}  // namespace ingot::codegen::cuda::detail
