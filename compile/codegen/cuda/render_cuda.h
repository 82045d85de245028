// Renders KernelSpecs to CUDA C++ for NVRTC (see compile/codegen/common/kernel_spec.h for the semantics). The
// generated code includes no header at all (NVRTC provides the device math functions and intrinsics), so a
// program compiles in a fraction of a second and never depends on the toolkit's include directory.
//
// Shape of the generated code (each kernel is one or two extern "C" __global__ functions):
//   Pointwise     adjacent dims contiguous in every buffer are merged and constant size-1 dims dropped; one
//                 grid-stride loop over the points. When every buffer's innermost stride is 0 or 1 there is
//                 also a VECTOR path: each thread handles `vector_width` consecutive points, loading and
//                 storing 16 bytes at a time; the kernel takes it only when, at run time, the innermost
//                 size is a multiple of the width, every base pointer is aligned and the outer strides are
//                 multiples of the width (misaligned views and odd sizes take the scalar path).
//   RowReduction  three (or four) functions: <symbol>_warp (one warp per row, several rows per block: short rows),
//                 <symbol>_block (one block per row: long rows) and <symbol>_col (lanes map to consecutive
//                 rows, threadIdx.y splits the columns: transposed reductions such as layer_norm's dw; and <symbol>_colsplit,
//                 which also splits the columns across blocks, see Note [Split column reductions]). Per row, one column loop per reduction
//                 phase (softmax: max, then sum), each thread accumulating in registers, combined with warp
//                 shuffles (and, for blocks, shared memory across warps); every thread then holds the
//                 reduced values and the epilogue loop writes the element outputs; row outputs are written
//                 once. Column loops have the same vector / scalar paths as pointwise kernels.
//   MultiTensor   ONE launch for the whole list: the host uploads a table of tensors (NB pointers + numel
//                 each) followed by (tensor, start) chunks; each block walks chunks (grid-stride), vectorized
//                 when the chunk's pointers are aligned.
// Values are computed in fp32 for bf16/f16/f32 (f64 stays f64, integers in 64 bits); loads widen, stores
// round to nearest even, exactly as the CPU backend does.
//
// Launch: every function takes one parameter, a struct of 8-byte slots (see KernelAbi): Pointwise and
// RowReduction get {bufs[NB], syms[max(NS,1)], scalars[max(NC,1)], flags} (RowReduction then ws, parts); MultiTensor gets {table,
// num_tensors, num_chunks, chunk, scalars[max(NC,1)], flags}. flags bit 0 allows the vector path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compile/codegen/common/kernel_spec.h"

namespace ingot::codegen::cuda {

// How a kernel is launched: everything here is a run-time choice (no recompilation), so an autotuner can
// time candidates of one compiled kernel.
struct LaunchConfig {
  enum class Rows : uint8_t { Auto, WarpPerRow, BlockPerRow, Columns };
  int block_threads = 256;       // pointwise, multi-tensor and warp-per-row blocks (a multiple of 32)
  int row_block_threads = 0;     // block-per-row: threads per row; 0 = from the row length (64..1024)
  Rows rows = Rows::Auto;        // Auto: Columns for transposed reductions (KernelAbi::prefer_columns), else
                                 // warp per row up to warp_row_max_cols columns, else block per row
  int64_t warp_row_max_cols = 1024;
  int col_rows = 64;             // Columns: rows per block (threadIdx.x): 128 bytes of bf16 per warp load
                                 // (GPT-2 b16 step 37.5 -> 37.1 ms against 32)
  int col_splits = 0;            // Columns: threads per row (threadIdx.y); 0 = from the row length
  int col_grid_splits = 0;       // Columns: blocks per tile of rows (gridDim.y, the _colsplit function);
                                 // 0 = enough to fill the GPU when the tiles alone do not, 1 = never split
  bool vectorize = true;         // allow the 16-byte path (the kernel still checks alignment and sizes)
  int waves = 8;                 // grid cap = waves * multiprocessors; grid-stride loops do the rest
  int64_t chunk_elems = 65536;   // MultiTensor: elements per chunk of the table (rounded to the width)
};

// Note [Warp-per-row launch bounds]: a row reduction's _warp function that keeps its rows in registers (Note [Rows
// kept in registers], render_cuda_rows.cpp) is built for blocks of at most kWarpRowMaxThreads threads, two blocks per
// SM at least, so each thread may have up to 128 registers; every other function is built for 1024 threads (64
// registers). A layer norm forward of 768 columns (f32 residual + bf16 delta) with its row in registers, built
// for 1024 threads, spilled and ran 62-65 us on an H200 where the same code built for 128-256 threads ran 41 us
// (3.7 TB/s; a plain copy 3.6 TB/s). The launcher keeps every _warp launch within the bound.
constexpr int kWarpRowMaxThreads = 256;

// _colsplit's tile counters: at most kSplitCounterBytes / 4 tiles of rows.
constexpr int64_t kSplitCounterBytes = 16384;

// What the host needs to know about a rendered kernel to launch it.
struct KernelAbi {
  KernelKind kind = KernelKind::Pointwise;
  int num_buffers = 0;
  int num_syms = 0;      // the spec's num_syms / num_scalars: how many values the caller passes
  int num_scalars = 0;
  int sym_slots = 1;     // syms slots in the parameter struct: max(num_syms, 1)
  int scalar_slots = 1;  // max(num_scalars, 1)
  int vector_width = 1;  // elements per vector access; 1 = the kernel has no vector path
  bool index32 = false;  // indices computed in 32 bits (all sizes constant and small)
  bool prefer_columns = false;  // RowReduction: a transposed reduction, best launched as Rows::Columns
  // RowReduction with a _colsplit function (Note [Split column reductions] in render_cuda.cpp): its number of
  // reductions. Its workspace (the parameter struct's last slot) holds kSplitCounterBytes of tile counters,
  // zero between launches, then split_reductions * splits * rows slots of 8 bytes.
  int split_reductions = 0;
  // RowReduction with column sums (Note [Column sums in row reductions] in render_cuda_rows.cpp): how many. Only
  // the _warp function exists (functions[0]) and <symbol>_colfin (functions[4]) adds the blocks' partials; the
  // _warp launch takes column_sums * warps * column_sum_row(cols, vector_width) floats of dynamic shared
  // memory and a workspace of
  // column_sums * parts * cols floats (`parts`, the struct's slot after ws: its grid size).
  int column_sums = 0;
  // Pointwise: the (coalesced) iteration space; RowReduction: rows..., cols. Sizes may be sym slots.
  std::vector<SymInt> dims;
  // The functions to look up in the module: Pointwise/MultiTensor: {symbol}; RowReduction: {symbol_warp,
  // symbol_block, symbol_col[, symbol_colsplit]}, or with column sums {symbol_warp, "", "", "", symbol_colfin}
  // (empty: not generated).
  std::vector<std::string> functions;
};

// Floats per warp and column sum in shared memory: one per column plus one after every `vector_width` columns,
// so that the lanes of a vector step (lane l owns columns l * width ...) hit distinct banks.
inline int64_t column_sum_row(int64_t cols, int vector_width) {
  return vector_width > 1 ? cols + cols / vector_width + 1 : cols;
}
// The shared memory a block's rows may take (without opting in to more per block).
constexpr int64_t kColumnSumSharedBytes = 48 * 1024;

// Note [Multi-tensor chunks]: a multi-tensor launch walks (tensor, start) chunks of one length with a grid-stride
// loop over `grid_blocks` blocks. The length: `chunk_elems` (the launch config's, 64K) or less, so that there are
// about four chunks per SM (`sms`) and at least 8 elements per thread of `block_threads`; where that leaves fewer
// than two rounds of the blocks the GPU holds at once (`resident_blocks`), about four chunks per block of the grid
// instead. Measured, not derived (bench/RESULTS.md, twenty-sixth session, H200): with the first rule alone the ~1B
// Llama's 33 per-bucket AdamW updates (~37M elements each: ~570 chunks of 64K for the 528 blocks held) ran 10.95 ms
// against 8.60 ms for the same bytes in one launch, and its DDP step in a world of one ~2 ms over the plain step; the
// short chunks take ~1.5 ms of that back, and its DDP step at 4 GPUs ran 80.49 ms instead of 83.18. Short chunks
// everywhere cost GPT-2's single update 0.90 -> 1.10 ms (each chunk begins with two dependent loads of its table
// entry); ~17K-element chunks (four rounds of the resident blocks), one block per chunk in whole waves, and one
// contiguous share per block gave nothing or lost (the last two: the Llama's single update 8.6 -> 10.6-10.8 ms).
int64_t multi_tensor_chunk(const std::vector<int64_t>& sizes, int64_t sms, int64_t resident_blocks, int64_t grid_blocks,
                           int block_threads, int vector_width, int64_t chunk_elems);

// The helpers every program starts with (dtype conversions, NaN-propagating max/min, warp/block reductions,
// vector loads and stores).
std::string render_preamble();

struct RenderedKernel {
  std::string source;  // the kernel's parameter struct and __global__ functions
  KernelAbi abi;
};

// A fingerprint of this renderer: the preamble and the code it produces for probe kernels that use every
// op and kind. Part of the cubin cache key, so a changed renderer never loads cubins built from an older
// one, even under the same ingot version.
const std::string& renderer_fingerprint();

// One kernel; `spec` is validated and canonicalized here. `symbol` names its functions.
RenderedKernel render_kernel(const KernelSpec& spec, const std::string& symbol);

}  // namespace ingot::codegen::cuda
