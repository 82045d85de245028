// Pointwise and MultiTensor kernels of the CUDA renderer (render_cuda_core.h).
#include <algorithm>
#include <string>
#include <vector>

#include "compile/codegen/cuda/render_cuda_core.h"
#include "runtime/error.h"

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
  for (int d = 0; d < nd; ++d) idx_.push_back(std::string("i").append(std::to_string(d)));  // GCC 12 bug 105329, as v()
  if (vec_ > 1) {
    const std::string V = std::to_string(vec_), nl = "n" + std::to_string(nd - 1);
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
    idx_[nd - 1] = "i" + std::to_string(nd - 1);
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
  declare_buffers([](int i) { return "tab[t].b[" + std::to_string(i) + "]"; });
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
    for (size_t i = 0; i < k_.buffers.size(); ++i) o_zero_(i);
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

// MultiTensor vector accesses are at `b<i> + o<i> + i` with o<i> = 0.
void Renderer::o_zero_(size_t i) {
  if (used_[i]) line("const long long o" + std::to_string(i) + " = 0;");
}

}  // namespace ingot::codegen::cuda::detail
