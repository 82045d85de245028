// Pointwise kernels of the CUDA renderer (render_cuda_core.h): a grid-stride loop over the points, and a vector
// path taking `vector_width` consecutive points per thread when the layout allows it (render_cuda.h).
#include <string>
#include <vector>

#include "compile/codegen/cuda/render_cuda_core.h"

namespace ingot::codegen::cuda::detail {

void Renderer::pointwise() {
  const int nd = static_cast<int>(k_.dims.size());
  open("extern \"C\" __global__ void __launch_bounds__(1024) " + sym_ + "(const " + sym_ + "_p p) {");
  prologue();
  std::vector<int> body;
  for (size_t i = 0; i < k_.nodes.size(); ++i)
    if (!invariant_[i]) body.push_back(static_cast<int>(i));
  std::string total;
  for (int d = 0; d < nd; ++d) total += (d ? " * " : "") + std::string("n") + std::to_string(d);
  line("const I total = " + (total.empty() ? std::string("1") : total) + ";");
  line("const I nthreads = (I)gridDim.x * blockDim.x;");
  acc_.assign(k_.buffers.size(), "");
  idx_.clear();
  for (int d = 0; d < nd; ++d) idx_.push_back(numbered("i", d));
  if (vec_ > 1) {
    const std::string V = std::to_string(vec_), nl = numbered("n", nd - 1);
    open("if (" + vector_condition(nl) + ") {");
    line("const I groups_inner = " + nl + " / " + V + ";");
    open("for (I g = (I)blockIdx.x * blockDim.x + threadIdx.x; g < total / " + V + "; g += nthreads) {");
    decompose("g", nd, "groups_inner", V);
    offsets("o", nd);  // unit-stride buffers: the first element of the group; broadcast ones: their element
    for (size_t i = 0; i < k_.buffers.size(); ++i)
      if (used_[i]) acc_[i] = b(static_cast<int>(i)) + "[o" + std::to_string(i) + "]";
    vector_accesses(loaded_by(body), k_.stores, "o", "");
    idx_[nd - 1] = "(i" + std::to_string(nd - 1) + " + j)";
    line("#pragma unroll");
    open("for (int j = 0; j < " + V + "; ++j) {");
    for (int id : body) emit_node(id);
    for (const Store& s : k_.stores) line(store_stmt(s.buffer, s.node));
    close();
    vector_stores(k_.stores, "o", "");
    close();
    line("return;");
    close();
    idx_[nd - 1] = numbered("i", nd - 1);
  }
  open("for (I lin = (I)blockIdx.x * blockDim.x + threadIdx.x; lin < total; lin += nthreads) {");
  decompose("lin", nd, "", "");
  offsets("o", nd);
  for (size_t i = 0; i < k_.buffers.size(); ++i)
    if (used_[i]) acc_[i] = b(static_cast<int>(i)) + "[o" + std::to_string(i) + "]";
  for (int id : body) emit_node(id);
  for (const Store& s : k_.stores) line(store_stmt(s.buffer, s.node));
  close();
  close();
}

}  // namespace ingot::codegen::cuda::detail
