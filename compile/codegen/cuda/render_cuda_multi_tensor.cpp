// MultiTensor kernels of the CUDA renderer (render_cuda_core.h): ONE launch for the whole list; the host uploads a
// table of tensors followed by (tensor, start) chunks, and each block walks chunks, vectorized when the chunk's
// pointers are aligned (render_cuda.h). The scalars come in the parameters (c) or, when cs is set, from device
// memory: what lets a CUDA graph replay an optimizer update whose learning rate changes every step.
#include <algorithm>
#include <string>
#include <vector>

#include "compile/codegen/cuda/render_cuda_core.h"

namespace ingot::codegen::cuda::detail {

void Renderer::multi_tensor() {
  const std::string nb = std::to_string(k_.buffers.size()), V = std::to_string(vec_);
  line("struct " + sym_ + "_t {");
  line("  void* b[" + nb + "];");
  line("  long long n;");
  line("};");
  line("struct " + sym_ + "_p {");
  line("  const void* table;");
  line("  long long num_tensors, num_chunks, chunk;");
  line("  double c[" + std::to_string(std::max(1, k_.num_scalars)) + "];");
  line("  long long flags;");
  line("  const double* cs;");  // null: the scalars are c; else they are read here, on the device
  line("};");
  open("extern \"C\" __global__ void __launch_bounds__(1024) " + sym_ + "(const " + sym_ + "_p p) {");
  line("typedef long long I;");
  for (size_t i = 0; i < k_.nodes.size(); ++i)
    if (invariant_[i]) emit_node(static_cast<int>(i));
  line("const " + sym_ + "_t* tab = (const " + sym_ + "_t*)p.table;");
  line("const long long* chunks = (const long long*)(tab + p.num_tensors);");
  open("for (long long ch = blockIdx.x; ch < p.num_chunks; ch += gridDim.x) {");
  line("const long long t = chunks[2 * ch], start = chunks[2 * ch + 1], n = tab[t].n;");
  line("const long long end = start + p.chunk < n ? start + p.chunk : n;");
  declare_buffers([](int i) { return "tab[t].b[" + std::to_string(i) + "]"; }, /*used_only=*/true);
  std::vector<int> body;
  for (size_t i = 0; i < k_.nodes.size(); ++i)
    if (!invariant_[i]) body.push_back(static_cast<int>(i));
  acc_.assign(k_.buffers.size(), "");
  idx_ = {"i"};
  line("long long first = start;");
  if (vec_ > 1) {
    open("if (" + vector_condition("") + ") {");
    line("const long long vend = start + (end - start) / " + V + " * " + V + ";");
    open("for (long long i = start + (long long)threadIdx.x * " + V + "; i < vend; i += (long long)blockDim.x * " + V + ") {");
    // The vector accesses are at `b<i> + o<i> + i` with o<i> = 0.
    for (size_t i = 0; i < k_.buffers.size(); ++i)
      if (used_[i]) line("const long long o" + std::to_string(i) + " = 0;");
    vector_accesses(loaded_by(body), k_.stores, "o", "i");
    idx_ = {"(i + j)"};
    line("#pragma unroll");
    open("for (int j = 0; j < " + V + "; ++j) {");
    for (int id : body) emit_node(id);
    for (const Store& s : k_.stores) line(store_stmt(s.buffer, s.node));
    close();
    vector_stores(k_.stores, "o", "i");
    close();
    line("first = vend;");
    close();
  }
  idx_ = {"i"};
  open("for (long long i = first + threadIdx.x; i < end; i += blockDim.x) {");
  for (size_t i = 0; i < k_.buffers.size(); ++i)
    if (used_[i]) acc_[i] = b(static_cast<int>(i)) + "[i]";
  for (int id : body) emit_node(id);
  for (const Store& s : k_.stores) line(store_stmt(s.buffer, s.node));
  close();
  close();
  close();
}

}  // namespace ingot::codegen::cuda::detail
