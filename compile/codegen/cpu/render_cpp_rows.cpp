// RowReduction kernels of the C++ renderer (render_cpp_core.h): one OpenMP loop over rows; per row, one `omp simd
// reduction` loop per phase of the row plan (RowPhases, decided before printing), then one epilogue loop for the
// element outputs; row outputs are stored once per row. A kernel with a single row (a full reduction) splits its
// column loops over threads instead.
#include <cmath>
#include <string>
#include <vector>

#include "compile/codegen/cpu/render_cpp_core.h"

namespace ingot::codegen::cpu::detail {

void Renderer::row_reduction() {
  const RowPhases plan = plan_rows();
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
  for (int id : plan.phases[0].row_nodes) emit_at(id, "");
  for (size_t p = 1; p < plan.phases.size(); ++p) {
    const RowPhases::Phase& ph = plan.phases[p];
    std::string clauses;
    for (int r : ph.reductions) {
      const Node& nd_r = k_.nodes[static_cast<size_t>(r)];
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
    for (int id : ph.closure) emit_at(id, iv);
    for (int r : ph.reductions) {
      const Node& nd_r = k_.nodes[static_cast<size_t>(r)];
      const std::string acc = "acc" + std::to_string(r), x = as(nd_r.a, nd_r.dtype);
      if (nd_r.op == Op::ReduceSum) line(acc + " += " + x + ";");
      else if (nd_r.op == Op::ReduceMax) line(acc + " = " + max_expr(x, acc) + ";");
      else line(acc + " = " + min_expr(x, acc) + ";");
    }
    --indent_;
    line("}");
    for (int r : ph.reductions)
      line("const " + std::string(compute_type(k_.nodes[static_cast<size_t>(r)].dtype)) + " " + v(r) + " = acc" +
           std::to_string(r) + ";");
    for (int id : ph.row_nodes) emit_at(id, "");
  }
  if (!plan.element_stores.empty()) {
    line(simd);
    line("for (int64_t " + iv + " = 0; " + iv + " < " + n + "; ++" + iv + ") {");
    ++indent_;
    for (int id : plan.epilogue) emit_at(id, iv);
    for (const Store& s : plan.element_stores) line(store_at(s, iv));
    --indent_;
    line("}");
  }
  for (const Store& s : plan.row_stores) line(store_at(s, ""));
  --indent_;
  line("}");
}

}  // namespace ingot::codegen::cpu::detail
