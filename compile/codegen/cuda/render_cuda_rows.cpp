// RowReduction kernels of the CUDA renderer (render_cuda_core.h): warp-, block- and column-per-row variants,
// rows kept in registers, column sums and split column reductions.
#include <algorithm>
#include <string>
#include <vector>

#include "compile/codegen/cuda/render_cuda_core.h"
#include "runtime/error.h"

namespace ingot::codegen::cuda::detail {

// One column loop over the current row: scalar (`c` from tid by nt) or vector (groups of vec_ columns).
// `body` emits the per-column statements (acc_ and idx_ already point at the column).
template <typename Body>
void Renderer::column_loop(const std::vector<int>& closure, const std::vector<Store>& outs, Body body) {
  const int L = last();
  const std::string nl = "n" + std::to_string(L);
  auto point_scalar = [&]() {
    for (size_t i = 0; i < k_.buffers.size(); ++i)
      if (used_[i]) acc_[i] = b(static_cast<int>(i)) + "[r" + std::to_string(i) + (element_buffer(i) ? " + c" + col_stride(i) : "") + "]";
    idx_[L] = "c";
  };
  const bool vector = vec_ > 1 && !row_.columns;
  if (vector) {
    const std::string V = std::to_string(vec_);
    open("if (vec) {");
    // Note [Rows kept in registers]: each phase walks the lane's chunks of the row and reads the cached
    // buffers from rb<i>[k] (load_row) instead of loading them again.
    if (row_.unroll) open_row_chunks();
    else open("for (I c = tid * " + V + "; c < " + nl + "; c += nt * " + V + ") {");
    point_scalar();
    vector_accesses(loaded_by(closure), outs, "r", "c");
    idx_[L] = "(c + j)";
    line("#pragma unroll");
    open("for (int j = 0; j < " + V + "; ++j) {");
    body();
    close();
    vector_stores(outs, "r", "c");
    close();
    if (row_.unroll) close();
    close("} else {");
    ++indent_;
  }
  // Column variants load 2-4 bytes per lane and step and reach ~1.4-2.0 of an H100's 3.35 TB/s; unrolling
  // this loop by 4 changed nothing (0.754 vs 0.753 ms per GPT-2 step), 16-byte loads of 8 columns per lane
  // would (Note [Column sums], runtime/kernels/cuda/reduce.cu).
  if (col_begin_.empty()) open("for (I c = tid; c < " + nl + "; c += nt) {");
  else open("for (I c = " + col_begin_ + " + tid; c < " + col_end_ + "; c += nt) {");
  point_scalar();
  body();
  close();
  if (vector) close();
  point_row();
}

std::string Renderer::col_stride(size_t i) const {
  const SymInt& s = k_.buffers[i].strides[last()];
  return is_const(s, 1) ? "" : " * (I)" + sym_str(s);
}

// Row-level accesses: the buffer's element of this row.
void Renderer::point_row() {
  for (size_t i = 0; i < k_.buffers.size(); ++i)
    if (used_[i]) acc_[i] = b(static_cast<int>(i)) + "[r" + std::to_string(i) + "]";
}

// A transposed reduction (layer_norm's dw): no element buffer is contiguous along the reduced dim, but
// one is along the last row dim, so lanes should map to rows (kColumns) for coalesced loads. Buffers that
// every row reads alike (stride 0 along the last row dim: layer_norm's per-token mean and rstd here) are
// one row of data that stays in cache, so their layout does not decide.
bool Renderer::prefer_columns() const {
  const int L = last();
  if (L < 1) return false;
  bool any_row_unit = false;
  for (size_t i = 0; i < k_.buffers.size(); ++i) {
    if (!used_[i] || !element_buffer(i) || is_const(k_.buffers[i].strides[L - 1], 0)) continue;
    if (is_const(k_.buffers[i].strides[L], 1)) return false;
    any_row_unit = any_row_unit || is_const(k_.buffers[i].strides[L - 1], 1);
  }
  return any_row_unit;
}

// Note [Rows kept in registers]: one warp per row of constant length, and at most 48 loaded values per lane from
// buffers that differ between rows (two rows of 768: a layer norm's residual add; with three, as in the norm
// backward, register pressure made it slower: 1.73 -> 1.82 ms per GPT-2 step). A norm's weight, the same for every
// row, is not counted. Each such buffer's share of the row is loaded once, into rb<i>[k][j] (chunk k of the lane's
// RowPlan::chunks), which every phase reads: left to the compiler, the phases' repeated loads were not merged (the
// forward norm's PTX held 3x its loads). The function is then built for blocks of at most kWarpRowMaxThreads (Note
// [Warp-per-row launch bounds], render_cuda.h), so the row has registers.
Renderer::RowPlan Renderer::plan_row(Variant variant) const {
  const int L = last();
  RowPlan rp;
  rp.variant = variant;
  rp.columns = variant == kColumns || variant == kColumnsSplit;
  const SymInt& row_len = k_.dims[static_cast<size_t>(L)];
  int64_t row_loads = 0;
  rp.cached.assign(k_.buffers.size(), false);  // read only while unroll
  for (size_t i = 0; i < k_.buffers.size(); ++i) {
    if (!used_[i] || k_.buffers[i].is_output || !element_buffer(i)) continue;
    bool per_row = false;
    for (int d = 0; d < L; ++d) per_row = per_row || !is_const(k_.buffers[i].strides[static_cast<size_t>(d)], 0);
    row_loads += per_row;
    rp.cached[i] = per_row && unit_[i];
  }
  const int64_t chunks = row_len.is_constant() ? (row_len.value + 32 * vec_ - 1) / (32 * vec_) : 0;
  rp.unroll = variant == kWarp && vec_ > 1 && row_len.is_constant() && row_loads * chunks * vec_ <= 48;
  rp.chunks = rp.unroll ? static_cast<int>(chunks) : 0;
  return rp;
}

void Renderer::row_reduction(Variant variant) {
  const int L = last();
  static const char* suffix[] = {"_warp", "_block", "_col", "_colsplit"};
  row_ = plan_row(variant);
  const std::string bounds = row_.unroll
                                 ? "__launch_bounds__(" + std::to_string(kWarpRowMaxThreads) + ", 2)"
                                 : std::string("__launch_bounds__(1024)");
  open("extern \"C\" __global__ void " + bounds + " " + sym_ + suffix[variant] + "(const " + sym_ + "_p p) {");
  prologue();
  std::string rows;
  for (int d = 0; d < L; ++d) rows += (d ? " * " : "") + std::string("n") + std::to_string(d);
  line("const I rows = " + (rows.empty() ? std::string("1") : rows) + ";");
  if (vec_ > 1 && !row_.columns) line("const bool vec = " + vector_condition("n" + std::to_string(L)) + ";");
  const std::vector<Store>& col_sums = phases_.column_sums;
  if (!col_sums.empty()) column_sum_setup(col_sums.size());
  acc_.assign(k_.buffers.size(), "");
  idx_.assign(k_.dims.size(), "");
  for (int d = 0; d < L; ++d) idx_[d] = "i" + std::to_string(d);
  open_rows(variant);
  decompose("row", L, "", "");
  offsets("r", L);
  point_row();
  if (row_.unroll) load_row();
  point_row();
  for (int id : phases_.phases[0].row_nodes) emit_node(id);
  for (size_t p = 1; p < phases_.phases.size(); ++p) reduce_phase(p, variant);
  row_outputs();
  close();
  if (!col_sums.empty()) column_sum_partials(col_sums.size());
  close();
  row_ = RowPlan{};
}

// The reductions' shared memory and the loop over the rows this warp (kWarp), block (kBlock) or tile of rows
// (kColumns, kColumnsSplit) computes, left open with `row` set.
void Renderer::open_rows(Variant variant) {
  if (variant == kBlock) {
    for (int r : phases_.reductions)
      line("__shared__ " + std::string(compute_type(k_.nodes[r].dtype)) + " sm" + std::to_string(r) + "[32];");
    line("const I tid = threadIdx.x, nt = blockDim.x;");
    open("for (I row = blockIdx.x; row < rows; row += gridDim.x) {");
  } else if (row_.columns) {
    const bool split = variant == kColumnsSplit;
    for (int r : phases_.reductions)
      line("__shared__ " + std::string(compute_type(k_.nodes[r].dtype)) + " sm" + std::to_string(r) + "[1024];");
    if (split) line("__shared__ bool ig_last;");
    line("const I tid = threadIdx.y, nt = blockDim.y;");
    if (split) {
      open("{  // gridDim.x covers every tile of rows, gridDim.y splits the columns");
      line("const I row0 = (I)blockIdx.x * blockDim.x;");
    } else {
      open("for (I row0 = (I)blockIdx.x * blockDim.x; row0 < rows; row0 += (I)gridDim.x * blockDim.x) {");
    }
    line("const bool active = row0 + (I)threadIdx.x < rows;");
    line("// Idle lanes of the last tile reread the last row (loads stay in bounds) and store nothing.");
    line("const I row = active ? row0 + (I)threadIdx.x : rows - 1;");
  } else {
    line("const I tid = threadIdx.x & 31, nt = 32, warps = blockDim.x >> 5;");
    open("for (I row = (I)blockIdx.x * warps + (threadIdx.x >> 5); row < rows; row += (I)gridDim.x * warps) {");
  }
}

// Phase p: its reductions accumulated over the row's columns (this block's range under kColumnsSplit), combined
// across the threads of the row, then the row-level nodes that read them.
void Renderer::reduce_phase(size_t p, Variant variant) {
  const int L = last();
  const bool split = variant == kColumnsSplit;
  const std::vector<int>& reds = phases_.phases[p].reductions;
  for (int r : reds) {
    const Node& nr = k_.nodes[r];
    line(std::string(compute_type(nr.dtype)) + " acc" + std::to_string(r) + " = " + reduce_identity(nr) + ";  // " +
         op_name(nr.op));
  }
  const std::vector<int>& closure = phases_.phases[p].closure;
  if (split) {
    const std::string nl = "n" + std::to_string(L);
    line("const I cb = (I)((long long)" + nl + " * blockIdx.y / gridDim.y), ce = (I)((long long)" + nl +
         " * (blockIdx.y + 1) / gridDim.y);");
    col_begin_ = "cb";
    col_end_ = "ce";
  }
  column_loop(closure, {}, [&] {
    for (int id : closure) emit_node(id);
    for (int r : reds) {
      const Node& nr = k_.nodes[r];
      const std::string acc = "acc" + std::to_string(r), x = as(nr.a, nr.dtype);
      if (nr.op == Op::ReduceSum) line(acc + " += " + x + ";");
      else line(acc + " = " + (nr.op == Op::ReduceMax ? "ig_max(" : "ig_min(") + acc + ", " + x + ");");
    }
  });
  col_begin_.clear();
  col_end_.clear();
  if (split) split_combine(reds);
  for (int r : reds) {
    const Node& nr = k_.nodes[r];
    const std::string f = reduce_functor(nr.op);
    const std::string acc = "acc" + std::to_string(r);
    const std::string sm = ", sm" + std::to_string(r) + ")";
    const std::string combine = variant == kBlock ? "ig_block_reduce(" + acc + ", " + f + sm
                                : row_.columns    ? "ig_col_reduce(" + acc + ", " + f + sm
                                                  : "ig_warp_reduce(" + acc + ", " + f + ")";
    line("const " + std::string(compute_type(nr.dtype)) + " " + v(r) + " = " + combine + ";");
  }
  point_row();
  for (int id : phases_.phases[p].row_nodes) emit_node(id);
}

// The row's outputs: element outputs and column sums in one more pass over the columns, then the row outputs
// (one thread of the row stores them).
void Renderer::row_outputs() {
  const int L = last();
  const std::vector<Store>& col_sums = phases_.column_sums;
  const std::vector<Store>& element_stores = phases_.element_stores;
  const std::vector<Store>& row_stores = phases_.row_stores;
  if (!element_stores.empty() || !col_sums.empty()) {
    const std::vector<int>& closure = phases_.epilogue;
    column_loop(closure, element_stores, [&] {
      for (int id : closure) emit_node(id);
      for (const Store& s : element_stores) line((row_.columns ? "if (active) " : "") + store_stmt(s.buffer, s.node));
      for (size_t j = 0; j < col_sums.size(); ++j)
        line("ig_cs" + std::to_string(j) + "[" + padded(idx_[L]) + "] += " +
             as(k_.nodes[col_sums[j].node].a, DType::f32) + ";");
    });
  }
  if (!row_stores.empty()) {
    point_row();
    open(row_.columns ? "if (active && tid == 0) {" : "if (tid == 0) {");
    for (const Store& s : row_stores) line(store_stmt(s.buffer, s.node));
    close();
  }
}

// Opens the loop over this lane's row_.chunks chunks of the row (chunk k starts at column c) and its bound
// check; the caller closes both.
void Renderer::open_row_chunks() {
  const std::string V = std::to_string(vec_);
  line("#pragma unroll");
  open("for (int k = 0; k < " + std::to_string(row_.chunks) + "; ++k) {");
  line("const I c = tid * " + V + " + k * nt * " + V + ";");
  open("if (c < n" + std::to_string(last()) + ") {");
}

// Note [Rows kept in registers]: this lane's chunks of the row of every cached buffer, loaded once per row.
void Renderer::load_row() {
  const std::string V = std::to_string(vec_), K = std::to_string(row_.chunks);
  for (size_t i = 0; i < k_.buffers.size(); ++i)
    if (row_.cached[i])
      line("alignas(16) " + std::string(storage_type(k_.buffers[i].dtype)) + " rb" + std::to_string(i) + "[" + K +
           "][" + V + "];");
  open("if (vec) {");
  open_row_chunks();
  for (size_t i = 0; i < k_.buffers.size(); ++i)
    if (row_.cached[i])
      line("ig_ldv<" + V + ">(rb" + std::to_string(i) + "[k], " + b(static_cast<int>(i)) + " + r" +
           std::to_string(i) + " + c);");
  close();
  close();
  close();
}

// Note [Column sums in row reductions]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A layer norm's backward needs dx per row (a row reduction) and dw, db per column (sums over every row) of
// the same values. As two kernels the second reads dy and x again: 75 MB per GPT-2 norm at b16, 25 norms,
// 0.7 ms per H200 step. Here the dx kernel also adds each ColumnSum operand into a per-warp row of shared
// memory (each column has one owner lane per warp, so no atomics); at the end the block adds its warps' rows
// in warp order and writes one partial row per block to the workspace, and <symbol>_colfin adds the blocks'
// partials in block order. Every step has a fixed order, so the sums do not depend on scheduling. Only the
// warp-per-row variant is generated; the launcher caps its grid so that the partials stay small.

// Column c of a shared row (render_cuda.h, column_sum_row: a padding float after every vector of columns).
std::string Renderer::padded(const std::string& c) const {
  return vec_ > 1 ? "(" + c + ") + (" + c + ") / " + std::to_string(vec_) : c;
}

// Shared rows ig_cs<j> of this warp, zeroed.
void Renderer::column_sum_setup(size_t count) {
  const std::string nl = "n" + std::to_string(last());
  line("extern __shared__ float ig_cs[];  // [column sums][warps][ig_row]");
  line("const long long ig_row = " + (vec_ > 1 ? nl + " + " + nl + " / " + std::to_string(vec_) + " + 1" : nl) + ";");
  line("const int ig_warps = blockDim.x >> 5, ig_warp = threadIdx.x >> 5;");
  line("for (long long i = threadIdx.x; i < " + std::to_string(count) +
       "LL * ig_warps * ig_row; i += blockDim.x) ig_cs[i] = 0.0f;");
  line("__syncthreads();");
  for (size_t j = 0; j < count; ++j)
    line("float* ig_cs" + std::to_string(j) + " = ig_cs + (" + std::to_string(j) + "LL * ig_warps + ig_warp) * ig_row;");
}

// After the row loop: the block's partial of every column sum, its warps added in order.
void Renderer::column_sum_partials(size_t count) {
  const std::string nl = "n" + std::to_string(last());
  line("__syncthreads();");
  open("for (long long c = threadIdx.x; c < " + std::to_string(count) + "LL * " + nl + "; c += blockDim.x) {");
  line("const long long j = c / " + nl + ", col = c % " + nl + ";");
  line("float s = 0.0f;");
  line("for (int w = 0; w < ig_warps; ++w) s += ig_cs[(j * ig_warps + w) * ig_row + " + padded("col") + "];");
  line("((float*)p.ws)[(j * gridDim.x + blockIdx.x) * " + nl + " + col] = s;");
  close();
}

// <symbol>_colfin: 32 columns x 32 lanes per block; lane y adds the partials y, y + 32, ... and the lanes are
// added in order; the total is stored like any output (rounded to the buffer's dtype).
void Renderer::column_finish() {
  const std::vector<Store>& sums = phases_.column_sums;
  const int L = last();
  const std::string nl = "n" + std::to_string(L);
  open("extern \"C\" __global__ void __launch_bounds__(1024) " + sym_ + "_colfin(const " + sym_ + "_p p) {");
  prologue();
  line("__shared__ float ig_lanes[32][33];");
  line("const I c = (I)blockIdx.x * 32 + threadIdx.x;");
  line("const float* ig_part = (const float*)p.ws;");
  acc_.assign(k_.buffers.size(), "");
  for (size_t j = 0; j < sums.size(); ++j) {
    const Store& st = sums[j];
    const std::string J = std::to_string(j);
    open("{");
    line("float s = 0.0f;");
    open("if (c < " + nl + ") {");
    line("const float* q = ig_part + " + J + "LL * p.parts * " + nl + " + c;");
    line("for (long long b = threadIdx.y; b < p.parts; b += 32) s += q[b * " + nl + "];");
    close();
    line("ig_lanes[threadIdx.y][threadIdx.x] = s;");
    line("__syncthreads();");
    open("if (threadIdx.y == 0 && c < " + nl + ") {");
    line("float t = 0.0f;");
    line("for (int y = 0; y < 32; ++y) t += ig_lanes[y][threadIdx.x];");
    line("const " + std::string(compute_type(k_.nodes[st.node].dtype)) + " " + v(st.node) + " = t;");
    acc_[st.buffer] = b(st.buffer) + "[c" + col_stride(static_cast<size_t>(st.buffer)) + "]";
    line(store_stmt(st.buffer, st.node));
    close();
    line("__syncthreads();");
    close();
  }
  close();
}

// Note [Split column reductions]: the block's partials acc<r> go to the workspace; the tile's last block
// leaves acc<r> holding this thread's share of every split's partial (threadIdx.y strides the splits) for
// the usual combine, and every other block returns.
void Renderer::split_combine(const std::vector<int>& reds) {
  line("char* ig_ws = (char*)p.ws;");
  line("unsigned int* ig_count = (unsigned int*)ig_ws;");
  for (size_t j = 0; j < reds.size(); ++j) {
    const int r = reds[j];
    const std::string T = compute_type(k_.nodes[r].dtype), R = std::to_string(r);
    const std::string f = reduce_functor(k_.nodes[r].op);
    line(T + "* ig_part" + R + " = (" + T + "*)(ig_ws + " + std::to_string(kSplitCounterBytes) + " + " +
         std::to_string(j) + "LL * gridDim.y * rows * 8);");
    line("{ const " + T + " q = ig_col_reduce(acc" + R + ", " + f + ", sm" + R + ");");
    line("  if (active && tid == 0) ig_part" + R + "[(long long)blockIdx.y * rows + row] = q; }");
  }
  line("__threadfence();");
  line("__syncthreads();");
  line("if (threadIdx.x == 0 && threadIdx.y == 0) ig_last = atomicAdd(&ig_count[blockIdx.x], 1u) == gridDim.y - 1;");
  line("__syncthreads();");
  line("if (!ig_last) return;");
  line("__threadfence();");
  for (int r : reds) line("acc" + std::to_string(r) + " = " + reduce_identity(k_.nodes[r]) + ";");
  open("for (unsigned int s = threadIdx.y; s < gridDim.y; s += blockDim.y) {");
  for (int r : reds) {
    const std::string R = std::to_string(r);
    line("acc" + R + " = " + reduce_functor(k_.nodes[r].op) + "(acc" + R + ", __ldcg(&ig_part" + R +
         "[(long long)s * rows + row]));");
  }
  close();
  line("if (threadIdx.x == 0 && threadIdx.y == 0) ig_count[blockIdx.x] = 0;  // ready for the next launch");
}

}  // namespace ingot::codegen::cuda::detail
