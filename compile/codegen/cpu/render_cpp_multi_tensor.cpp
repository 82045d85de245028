// MultiTensor kernels of the C++ renderer (render_cpp_core.h): one OpenMP parallel region; each tensor of the
// list is a work-shared `omp for simd` loop (nowait: tensors are independent).
#include <string>

#include "compile/codegen/cpu/render_cpp_core.h"

namespace ingot::codegen::cpu::detail {

void Renderer::multi_tensor() {
  const std::string nb = std::to_string(k_.buffers.size());
  line("const int64_t num_tensors = syms[0];");
  line("int64_t total = 0;");
  line("for (int64_t t = 0; t < num_tensors; ++t) total += syms[1 + t];");
  line("#pragma omp parallel if (total >= " + std::to_string(kParallelThreshold) + ")");
  line("for (int64_t t = 0; t < num_tensors; ++t) {");
  ++indent_;
  line("const int64_t n = syms[1 + t];");
  declare_buffers([&nb](int i) { return "bufs[t * " + nb + " + " + std::to_string(i) + "]"; }, /*used_only=*/false);
  line("#pragma omp for simd schedule(static) nowait");
  line("for (int64_t i = 0; i < n; ++i) {");
  ++indent_;
  for (size_t i = 0; i < k_.nodes.size(); ++i)
    if (!invariant_[i]) emit_at(static_cast<int>(i), "i");
  for (const Store& s : k_.stores) line(store_at(s, "i"));
  --indent_;
  line("}");
  --indent_;
  line("}");
}

}  // namespace ingot::codegen::cpu::detail
