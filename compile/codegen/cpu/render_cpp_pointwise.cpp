// Pointwise kernels of the C++ renderer (render_cpp_core.h): adjacent dims contiguous in every buffer are merged
// first (coalesce_pointwise); the outer dims run as one OpenMP loop, the innermost dim is an `omp simd` loop.
#include <string>
#include <vector>

#include "compile/codegen/cpu/render_cpp_core.h"

namespace ingot::codegen::cpu::detail {

void Renderer::pointwise() {
  const size_t nd = k_.dims.size();
  std::vector<int> body;
  for (size_t i = 0; i < k_.nodes.size(); ++i)
    if (!invariant_[i]) body.push_back(static_cast<int>(i));
  if (nd == 0) {  // a single point
    for (int id : body) emit_at(id, "0");
    for (const Store& s : k_.stores) line(store_at(s, "0"));
    return;
  }
  const std::string iv = numbered("i", static_cast<int64_t>(nd - 1)), n = numbered("n", static_cast<int64_t>(nd - 1));
  const std::string split_inner =
      "#pragma omp parallel for simd schedule(static) if (" + n + " >= " + std::to_string(kParallelThreshold) + ")";
  auto inner_loop = [&](const std::string& pragma) {
    line(pragma);
    line("for (int64_t " + iv + " = 0; " + iv + " < " + n + "; ++" + iv + ") {");
    ++indent_;
    for (int id : body) emit_at(id, iv);
    for (const Store& s : k_.stores) line(store_at(s, iv));
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

}  // namespace ingot::codegen::cpu::detail
