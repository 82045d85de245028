// The C++ renderer's core, shared by its files (internal to compile/codegen/cpu): the Renderer, which prints one
// KernelSpec as C++ (render_cpp.h says what the generated code looks like) over the printer core the CUDA
// renderer shares (compile/codegen/common/printer_core.h).
//   render_cpp.cpp               the language (types, casts, literals, accesses), loops over the outer dims,
//                                render_kernel()
//   render_cpp_pointwise.cpp     Pointwise kernels
//   render_cpp_rows.cpp          RowReduction kernels
//   render_cpp_multi_tensor.cpp  MultiTensor kernels
//   render_cpp_preamble.cpp      the preamble and the renderer's fingerprint
#pragma once

#include <string>

#include "compile/codegen/common/printer_core.h"
#include "compile/codegen/cpu/render_cpp.h"

namespace ingot::codegen::cpu::detail {

class Renderer : public PrinterCore {
 public:
  Renderer(const KernelSpec& k, const std::string& symbol) : PrinterCore(k), symbol_(symbol) {}

  std::string run();

 private:
  const char* storage_type(DType t) const override;
  const char* compute_type(DType t) const override;
  std::string cast(const std::string& T, const std::string& x) const override;
  std::string one(const std::string& T) const override { return cast(T, "1"); }
  std::string math(const std::string& name, const std::string& T) const override;
  std::string int_literal(int64_t v) const override { return "INT64_C(" + std::to_string(v) + ")"; }
  std::string nan_literal(bool f32) const override { return f32 ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")"; }
  std::string inf_literal(bool f32) const override { return f32 ? "__builtin_inff()" : "__builtin_inf()"; }
  std::string float_literal(const std::string& hex, bool f32) const override { return f32 ? hex + "f" : hex; }
  std::string pow_expr(const Node& n, const std::string& x, const std::string& y) const override;
  std::string max_expr(const std::string& x, const std::string& y) const override;
  std::string min_expr(const std::string& x, const std::string& y) const override;
  std::string access(int buf) const override;
  std::string scalar_expr(const Node& n) const override;
  std::string index_expr(const Node& n) const override;

  // Node `id` with inner_ = `inner_var`: loads and the innermost Index read that loop variable.
  void emit_at(int id, const std::string& inner_var) {
    inner_ = inner_var;
    emit_node(id);
  }
  std::string store_at(const Store& s, const std::string& inner_var) {
    inner_ = inner_var;
    return store_stmt(s.buffer, s.node);
  }
  void row_bases(size_t outer_dims);
  void outer_count();
  void open_outer_loop(bool serial = false);

  void pointwise();      // render_cpp_pointwise.cpp
  void row_reduction();  // render_cpp_rows.cpp
  void multi_tensor();   // render_cpp_multi_tensor.cpp

  std::string symbol_;
  std::string inner_;  // the innermost loop variable at the current point ("" at row level)
};

}  // namespace ingot::codegen::cpu::detail
