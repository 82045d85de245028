// CUDA reductions: sum, mean, prod, max, min, argmax, argmin, logsumexp over the middle dim of a contiguous
// input read as [outer, n, inner]; out is contiguous [outer, inner].
//
// Approach: every thread folds a strided run of the reduced dim into a State (value, logsumexp sum, index),
// and states are combined with one associative, order-independent rule (ties in argmax/argmin go to the
// smaller index), so any tree of combines gives the CPU kernel's answer up to rounding.
//   inner == 1 (reducing the last dim): rows of n <= 1024 get one warp each (8 rows per block); longer rows a
//     256-thread block each, combined through shuffles and shared memory.
//   inner > 1: a block is a tile of tx columns x ty row lanes (tx*ty = 256, tx a power of two up to 32, so a
//     warp reads 32 / tx consecutive rows of tx contiguous columns); row lanes combine in shared memory.
// When those blocks cannot fill the GPU (few outputs, long n), n is cut into segments: each block writes the
// State of its segment, and a second kernel combines each output's segments in order.
//
// Numerics, as on the CPU (runtime/kernels/cpu/reduce.cpp): floating inputs accumulate in f64 (reductions are
// memory-bound; Hopper's f64 units keep up), integral inputs in int64 except mean and logsumexp. Max/min
// propagate NaN; argmax/argmin return the first index of the extreme, a NaN counting as the extreme.
// Note [Column sums]: the sum over the rows of a tall bf16 / f16 [n, inner] matrix (a bias gradient: 16384 x 3072
// in GPT-2's MLP) is its own path: 16-byte loads of 8 columns per thread, f32 partial sums per block of rows in a
// fixed order, then one pass adding the partials in order (deterministic). The generic column kernel loads one
// element per thread per row and reaches ~1.5 of the H100's 3.35 TB/s; 8 columns per load reach ~2.3 (42 vs 66
// us for 16384 x 3072, bench/RESULTS.md). Compiled graphs leave such sums to this kernel (compile/passes/fuse.cpp).
#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/allocator.h"
#include "runtime/kernels/cuda/common.cuh"
#include "runtime/kernels/kernels.h"

namespace ingot::kernels::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int64_t kWarpRowMax = 1024;   // rows up to this long get a warp, longer ones a block
constexpr int64_t kMinSegment = 4096;   // elements (inner == 1) or rows x lanes (inner > 1) per segment, at least

template <typename Acc>
struct State {
  Acc v;
  double s;     // logsumexp: sum of exp(x - v)
  int64_t idx;  // argmax/argmin position; < 0 marks a state that has seen no element
};

template <typename Acc>
__device__ __forceinline__ bool is_nan(Acc v) {
  if constexpr (std::is_floating_point_v<Acc>) return v != v;
  else return false;
}

// Whether candidate (v, i) replaces the current extreme (cur, ci).
template <typename Acc>
__device__ __forceinline__ bool better(Acc v, int64_t i, Acc cur, int64_t ci, bool max) {
  if (is_nan(cur)) return is_nan(v) && i < ci;
  if (is_nan(v)) return true;
  if (v == cur) return i < ci;
  return max ? v > cur : v < cur;
}

template <typename Acc>
__device__ __forceinline__ State<Acc> combine(ReduceOp op, State<Acc> p, const State<Acc>& q) {
  if (q.idx < 0) return p;
  if (p.idx < 0) return q;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: p.v += q.v; break;
    case ReduceOp::Prod: p.v *= q.v; break;
    case ReduceOp::Max:
      if (is_nan(q.v) || q.v > p.v) p.v = q.v;
      break;
    case ReduceOp::Min:
      if (is_nan(q.v) || q.v < p.v) p.v = q.v;
      break;
    case ReduceOp::ArgMax:
    case ReduceOp::ArgMin:
      if (better(q.v, q.idx, p.v, p.idx, op == ReduceOp::ArgMax)) {
        p.v = q.v;
        p.idx = q.idx;
      }
      break;
    case ReduceOp::LogSumExp: {
      if (is_nan(p.v) || is_nan(q.v)) {
        if (!is_nan(p.v)) p.v = q.v;
        break;
      }
      // Sums of states whose maximum is +-inf are meaningless and dropped (finalize decides those by v).
      const double a = static_cast<double>(p.v), b = static_cast<double>(q.v);
      const double sa = isfinite(a) ? p.s : 0.0, sb = isfinite(b) ? q.s : 0.0;
      if (b > a) {
        p.s = (isfinite(b) ? sa * exp(a - b) : 0.0) + sb;
        p.v = q.v;
      } else {
        p.s = sa + (isfinite(a) ? sb * exp(b - a) : 0.0);
      }
      break;
    }
  }
  return p;
}

template <typename Acc>
__device__ __forceinline__ State<Acc> shfl_xor(const State<Acc>& x, int o) {
  return State<Acc>{__shfl_xor_sync(0xffffffffu, x.v, o), __shfl_xor_sync(0xffffffffu, x.s, o),
                    __shfl_xor_sync(0xffffffffu, x.idx, o)};
}

template <typename Acc>
__device__ __forceinline__ State<Acc> warp_combine(ReduceOp op, State<Acc> x) {
  for (int o = 16; o > 0; o >>= 1) x = combine(op, x, shfl_xor(x, o));
  return x;
}

// Folds in[base + i * step] for i in [r0, r1) with stride `every` into a state.
template <typename Acc>
__device__ __forceinline__ State<Acc> fold(ReduceOp op, const void* in, DType dt, int64_t base, int64_t step,
                                           int64_t r0, int64_t r1, int64_t every) {
  State<Acc> st{Acc(0), 0.0, -1};
  for (int64_t i = r0; i < r1; i += every)
    st = combine(op, st, State<Acc>{load_dyn<Acc>(in, dt, base + i * step), 1.0, i});
  return st;
}

template <typename Acc>
__device__ __forceinline__ void finalize(ReduceOp op, const State<Acc>& st, int64_t n, void* out, DType odt,
                                         int64_t j) {
  switch (op) {
    case ReduceOp::ArgMax:
    case ReduceOp::ArgMin: store_dyn<int64_t>(out, odt, j, st.idx); break;
    case ReduceOp::Mean: store_dyn<double>(out, odt, j, static_cast<double>(st.v) / static_cast<double>(n)); break;
    case ReduceOp::LogSumExp: {
      const double m = static_cast<double>(st.v);
      store_dyn<double>(out, odt, j, isfinite(m) ? m + log(st.s) : m);
      break;
    }
    default: store_dyn<Acc>(out, odt, j, st.v); break;
  }
}

// Where a block's result goes: the output when n is not segmented, else its segment's slot.
template <typename Acc>
__device__ __forceinline__ void emit(ReduceOp op, const State<Acc>& st, int64_t n, int nsegs, int seg,
                                     State<Acc>* partials, void* out, DType odt, int64_t j) {
  if (nsegs == 1) finalize(op, st, n, out, odt, j);
  else partials[j * nsegs + seg] = st;
}

// inner == 1, rows of n <= kWarpRowMax: warp w of block b reduces row b * 8 + w.
template <typename Acc>
__global__ void reduce_rows_warp_kernel(ReduceOp op, const void* in, DType dt, int64_t outer, int64_t n, void* out,
                                        DType odt) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kBlock / 32) + threadIdx.x / 32;
  if (row >= outer) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  State<Acc> st = warp_combine(op, fold<Acc>(op, in, dt, row * n, 1, lane, n, 32));
  if (lane == 0) finalize(op, st, n, out, odt, row);
}

// inner == 1, long rows: block (row, segment) reduces row[r0, r1).
template <typename Acc>
__global__ void reduce_rows_block_kernel(ReduceOp op, const void* in, DType dt, int64_t n, int64_t seg_len,
                                         int nsegs, State<Acc>* partials, void* out, DType odt) {
  __shared__ State<Acc> warps[kBlock / 32];
  const int64_t row = blockIdx.x;
  const int seg = static_cast<int>(blockIdx.y);
  const int64_t r0 = seg * seg_len, r1 = r0 + seg_len < n ? r0 + seg_len : n;
  State<Acc> st = warp_combine(op, fold<Acc>(op, in, dt, row * n, 1, r0 + threadIdx.x, r1, kBlock));
  if ((threadIdx.x & 31) == 0) warps[threadIdx.x / 32] = st;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kBlock / 32; ++w) st = combine(op, st, warps[w]);
    emit(op, st, n, nsegs, seg, partials, out, odt, row);
  }
}

// inner > 1: block (tile, segment); thread (x, y) folds column tile * tx + x over rows r0 + y, r0 + y + ty, ...
template <typename Acc>
__global__ void reduce_cols_kernel(ReduceOp op, const void* in, DType dt, int64_t n, int64_t inner, int64_t ctiles,
                                   int64_t seg_len, int nsegs, State<Acc>* partials, void* out, DType odt) {
  __shared__ State<Acc> lanes[kBlock];
  const int tx = blockDim.x, ty = blockDim.y, t = threadIdx.y * tx + threadIdx.x;
  const int64_t o = blockIdx.x / ctiles, j = (blockIdx.x % ctiles) * tx + threadIdx.x;
  const int seg = static_cast<int>(blockIdx.y);
  const int64_t r0 = seg * seg_len, r1 = r0 + seg_len < n ? r0 + seg_len : n;
  State<Acc> st{Acc(0), 0.0, -1};
  if (j < inner) st = fold<Acc>(op, in, dt, o * n * inner + j, inner, r0 + threadIdx.y, r1, ty);
  lanes[t] = st;
  __syncthreads();
  for (int half = ty / 2; half > 0; half /= 2) {
    if (threadIdx.y < half) lanes[t] = combine(op, lanes[t], lanes[t + half * tx]);
    __syncthreads();
  }
  if (threadIdx.y == 0 && j < inner) emit(op, lanes[threadIdx.x], n, nsegs, seg, partials, out, odt, o * inner + j);
}

// Combines each output's segment states in order.
template <typename Acc>
__global__ void combine_segments_kernel(ReduceOp op, const State<Acc>* partials, int nsegs, int64_t outputs,
                                        int64_t n, void* out, DType odt) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= outputs) return;
  State<Acc> st = partials[j * nsegs];
  for (int s = 1; s < nsegs; ++s) st = combine(op, st, partials[j * nsegs + s]);
  finalize(op, st, n, out, odt, j);
}

// Segments so that `units` blocks become about four waves, each segment holding at least kMinSegment items.
int segments_for(int64_t units, int64_t items_per_row, int64_t n, int device) {
  const int64_t want = 4 * static_cast<int64_t>(usable_sms(device));
  if (units >= want) return 1;
  int64_t by_size = std::max<int64_t>(1, n * items_per_row / kMinSegment);
  return static_cast<int>(std::min<int64_t>({ceil_div(want, units), by_size, 1024}));
}

template <typename Acc>
void reduce_impl(ReduceOp op, const Tensor& out, const Tensor& in, int64_t outer, int64_t n, int64_t inner) {
  LaunchContext ctx(out);
  const void* x = in.data_ptr();
  void* y = out.data_ptr();
  const DType dt = in.dtype(), odt = out.dtype();
  if (inner == 1 && n <= kWarpRowMax) {
    const auto grid = static_cast<unsigned>(ceil_div(outer, kBlock / 32));
    reduce_rows_warp_kernel<Acc><<<grid, kBlock, 0, ctx.stream>>>(op, x, dt, outer, n, y, odt);
    CUDA_CHECK_LAUNCH();
    return;
  }
  int tx = 1;
  while (tx < 32 && tx < inner) tx *= 2;
  const int ty = kBlock / tx;
  const int64_t ctiles = ceil_div(inner, tx);
  const int64_t units = inner == 1 ? outer : outer * ctiles;
  const int nsegs = segments_for(units, inner == 1 ? 1 : tx, n, ctx.device);
  const int64_t seg_len = ceil_div(n, nsegs);
  std::shared_ptr<void> scratch;
  State<Acc>* partials = nullptr;
  if (nsegs > 1) {
    scratch = allocator_for(out.device()).allocate(sizeof(State<Acc>) * static_cast<size_t>(outer * inner * nsegs));
    partials = static_cast<State<Acc>*>(scratch.get());
  }
  INGOT_CHECK(units <= INT32_MAX, "reduce: too many outputs (", units, " blocks) for one launch");
  const dim3 grid(static_cast<unsigned>(units), static_cast<unsigned>(nsegs));
  if (inner == 1) {
    reduce_rows_block_kernel<Acc><<<grid, kBlock, 0, ctx.stream>>>(op, x, dt, n, seg_len, nsegs, partials, y, odt);
  } else {
    reduce_cols_kernel<Acc><<<grid, dim3(tx, ty), 0, ctx.stream>>>(op, x, dt, n, inner, ctiles, seg_len, nsegs,
                                                                    partials, y, odt);
  }
  CUDA_CHECK_LAUNCH();
  if (nsegs > 1) {
    const int64_t outputs = outer * inner;
    combine_segments_kernel<Acc><<<static_cast<unsigned>(ceil_div(outputs, kBlock)), kBlock, 0, ctx.stream>>>(
        op, partials, nsegs, outputs, n, y, odt);
    CUDA_CHECK_LAUNCH();
  }
  // `scratch` goes back to the cache now: it is reused only by later work on this stream (Note [Streams]).
}

constexpr int kColsumLanes = 8;  // row lanes per block; 32 threads x 8 columns across

template <typename T>
__global__ void __launch_bounds__(32 * kColsumLanes)
    colsum_partial_kernel(const T* __restrict__ in, int64_t n, int64_t inner, int64_t rows_per_split,
                          float* __restrict__ part) {
  constexpr int V = 8;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * V;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_split, r1 = min(n, r0 + rows_per_split);
  float acc[V] = {};
  if (col < inner) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColsumLanes) {
      alignas(16) T v[V];
      *reinterpret_cast<uint4*>(v) = __ldg(reinterpret_cast<const uint4*>(in + r * inner + col));
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += to_acc<float>(v[j]);
    }
  }
  __shared__ float lanes[kColsumLanes][32 * V];
#pragma unroll
  for (int j = 0; j < V; ++j) lanes[threadIdx.y][threadIdx.x * V + j] = acc[j];
  __syncthreads();
  // 256 threads, 256 columns: each adds one column's lanes in lane order.
  const int t = threadIdx.y * 32 + threadIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 * V + t;
  if (c < inner) {
    float s = 0;
    for (int y = 0; y < kColsumLanes; ++y) s += lanes[y][t];
    part[static_cast<int64_t>(blockIdx.y) * inner + c] = s;
  }
}

// 32 columns x 8 lanes per block: lane y adds splits y, y + 8, ... and the lanes are added in order, so the
// result does not depend on scheduling (a thread per column alone took 8.5 us for 264 splits of 768 columns).
__global__ void __launch_bounds__(32 * kColsumLanes)
    colsum_finish_kernel(const float* __restrict__ part, int splits, int64_t inner, void* out, DType odt) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0;
  // Unrolled so that eight loads are in flight at once (the adds stay in order; a load at a time made this
  // kernel a chain of ~33 L2 round trips: 36 launches per GPT-2 step took 0.197 ms on an H200, now 0.151 ms).
  if (c < inner) {
#pragma unroll 8
    for (int i = threadIdx.y; i < splits; i += kColsumLanes) s += part[static_cast<int64_t>(i) * inner + c];
  }
  __shared__ float lanes[kColsumLanes][32];
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= inner) return;
  float total = 0;
  for (int y = 0; y < kColsumLanes; ++y) total += lanes[y][threadIdx.x];
  store_dyn<float>(out, odt, c, total);
}

// Note [Column sums]: whether reduce() takes the column-sum path.
bool colsum_applies(ReduceOp op, const Tensor& out, const Tensor& in, int64_t outer, int64_t n, int64_t inner) {
  return op == ReduceOp::Sum && outer == 1 && n >= 2048 && inner >= 256 && inner % 8 == 0 &&
         (in.dtype() == DType::bf16 || in.dtype() == DType::f16) && is_floating(out.dtype()) &&
         reinterpret_cast<uintptr_t>(in.data_ptr()) % 16 == 0;
}

void colsum(const Tensor& out, const Tensor& in, int64_t n, int64_t inner) {
  LaunchContext ctx(out);
  const int64_t tiles = ceil_div(inner, 32 * 8);
  // About six blocks of 256 threads per SM, at least 64 rows each.
  const int64_t blocks = 6 * static_cast<int64_t>(usable_sms(ctx.device));
  const int64_t splits = std::clamp<int64_t>(ceil_div(blocks, tiles), 1, std::min<int64_t>(ceil_div(n, 64), 65535));
  const int64_t rows_per_split = ceil_div(n, splits);
  std::shared_ptr<void> scratch = allocator_for(out.device()).allocate(sizeof(float) * static_cast<size_t>(splits * inner));
  float* part = static_cast<float*>(scratch.get());
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), block(32, kColsumLanes);
  if (in.dtype() == DType::bf16)
    colsum_partial_kernel<bf16><<<grid, block, 0, ctx.stream>>>(static_cast<const bf16*>(in.data_ptr()), n, inner,
                                                                rows_per_split, part);
  else
    colsum_partial_kernel<__half><<<grid, block, 0, ctx.stream>>>(static_cast<const __half*>(in.data_ptr()), n,
                                                                  inner, rows_per_split, part);
  CUDA_CHECK_LAUNCH();
  colsum_finish_kernel<<<static_cast<unsigned>(ceil_div(inner, 32)), dim3(32, kColsumLanes), 0, ctx.stream>>>(
      part, static_cast<int>(splits), inner, out.data_ptr(), out.dtype());
  CUDA_CHECK_LAUNCH();
}

double empty_value(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return 0.0;
    case ReduceOp::Prod: return 1.0;
    case ReduceOp::Mean: return std::numeric_limits<double>::quiet_NaN();
    case ReduceOp::LogSumExp: return -std::numeric_limits<double>::infinity();
    default: break;
  }
  INGOT_FAIL("reduce: ", reduce_name(op), " of an empty dimension has no identity");
}

}  // namespace

void reduce(ReduceOp op, const Tensor& out, const Tensor& in, int64_t outer, int64_t n, int64_t inner) {
  check_same_device("reduce", {&out, &in});
  INGOT_INTERNAL_CHECK(in.is_contiguous() && out.is_contiguous(), "reduce: operands must be contiguous");
  INGOT_INTERNAL_CHECK(in.numel() == outer * n * inner && out.numel() == outer * inner, "reduce: in has ",
                       in.numel(), " elements, out ", out.numel(), ", for [", outer, ", ", n, ", ", inner, "]");
  INGOT_INTERNAL_CHECK((op != ReduceOp::ArgMax && op != ReduceOp::ArgMin) || out.dtype() == DType::i64,
                       "reduce: arg reductions write i64");
  if (out.numel() == 0) return;
  if (n == 0) {
    fill(out, empty_value(op));
    return;
  }
  if (colsum_applies(op, out, in, outer, n, inner)) return colsum(out, in, n, inner);
  const bool exact_int = is_integral(in.dtype()) && op != ReduceOp::Mean && op != ReduceOp::LogSumExp;
  if (exact_int) reduce_impl<int64_t>(op, out, in, outer, n, inner);
  else reduce_impl<double>(op, out, in, outer, n, inner);
}

namespace {

// sum_pieces: up to kMaxPieces pieces per launch (more are folded into out by further launches, which add out's
// running sum first: the same additions in the same order, as out has the accumulation's dtype).
constexpr int kMaxPieces = 8;

template <typename T>
struct Pieces {
  const T* p[kMaxPieces];
  int n;
};

// Each thread adds kVec consecutive elements of every piece: 16-byte loads when every pointer is aligned
// (8 bf16 elements), else one element at a time (kVec = 1). Every piece's load is issued before the first add, so a
// thread has all of them in flight at once (the sum runs on few blocks beside the compute: it needs the bytes in
// flight per thread, not more threads).
template <typename T, typename Acc, int kVec>
__global__ void sum_pieces_kernel(Acc* out, Pieces<T> pieces, int64_t groups, bool with_out, bool last, Acc scale) {
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T x[kMaxPieces][kVec];
#pragma unroll
    for (int k = 0; k < kMaxPieces; ++k) {
      if (k >= pieces.n) break;
      if constexpr (kVec * sizeof(T) == 16) {
        *reinterpret_cast<uint4*>(x[k]) = *reinterpret_cast<const uint4*>(pieces.p[k] + g * kVec);
      } else {
#pragma unroll
        for (int v = 0; v < kVec; ++v) x[k][v] = pieces.p[k][g * kVec + v];
      }
    }
    Acc acc[kVec];
#pragma unroll
    for (int v = 0; v < kVec; ++v) acc[v] = with_out ? out[g * kVec + v] + to_acc<Acc>(x[0][v]) : to_acc<Acc>(x[0][v]);
#pragma unroll
    for (int k = 1; k < kMaxPieces; ++k) {
      if (k >= pieces.n) break;
#pragma unroll
      for (int v = 0; v < kVec; ++v) acc[v] += to_acc<Acc>(x[k][v]);
    }
#pragma unroll
    for (int v = 0; v < kVec; ++v) out[g * kVec + v] = last ? acc[v] * scale : acc[v];
  }
}

}  // namespace

void sum_pieces(const Tensor& out, const std::vector<Tensor>& pieces, double scale, int64_t max_blocks) {
  INGOT_INTERNAL_CHECK(out.is_contiguous() && (out.dtype() == DType::f32 || out.dtype() == DType::f64) &&
                           !pieces.empty(), "sum_pieces: expected a contiguous f32/f64 output and pieces");
  const int64_t n = out.numel();
  for (const Tensor& p : pieces) {
    check_same_device("sum_pieces", {&out, &p});
    INGOT_INTERNAL_CHECK(p.is_contiguous() && p.numel() == n && p.dtype() == pieces[0].dtype(),
                         "sum_pieces: pieces must be contiguous, of ", n, " elements and one dtype");
  }
  if (n == 0) return;
  LaunchContext ctx(out);
  dispatch_float(out.dtype(), "sum_pieces", [&](auto otag) {
    using Acc = decltype(otag);
    if constexpr (std::is_same_v<Acc, float> || std::is_same_v<Acc, double>) {
      dispatch_float(pieces[0].dtype(), "sum_pieces", [&](auto ptag) {
        using T = decltype(ptag);
        constexpr int kVec = 16 / sizeof(T);
        for (size_t first = 0; first < pieces.size(); first += kMaxPieces) {
          Pieces<T> pp{};
          pp.n = static_cast<int>(std::min<size_t>(kMaxPieces, pieces.size() - first));
          bool aligned = n % kVec == 0 && reinterpret_cast<uintptr_t>(out.data_ptr()) % (kVec * sizeof(Acc)) == 0;
          for (int k = 0; k < pp.n; ++k) {
            pp.p[k] = static_cast<const T*>(pieces[first + static_cast<size_t>(k)].data_ptr());
            aligned = aligned && reinterpret_cast<uintptr_t>(pp.p[k]) % 16 == 0;
          }
          const bool with_out = first > 0, last = first + kMaxPieces >= pieces.size();
          Acc* o = static_cast<Acc*>(out.data_ptr());
          // Capped: few blocks of many threads (each SM's share of the bytes in flight), else the usual grid.
          const int threads = max_blocks > 0 ? 1024 : kBlock;
          auto grid = [&](int64_t items) {
            const unsigned g = grid_for(items, threads, ctx.device);
            return max_blocks > 0 ? static_cast<unsigned>(std::min<int64_t>(g, max_blocks)) : g;
          };
          if (aligned) {
            const int64_t groups = n / kVec;
            sum_pieces_kernel<T, Acc, kVec><<<grid(groups), threads, 0, ctx.stream>>>(o, pp, groups, with_out, last,
                                                                                     static_cast<Acc>(scale));
          } else {
            sum_pieces_kernel<T, Acc, 1><<<grid(n), threads, 0, ctx.stream>>>(o, pp, n, with_out, last,
                                                                              static_cast<Acc>(scale));
          }
          CUDA_CHECK_LAUNCH();
        }
      });
    } else {
      INGOT_FAIL("sum_pieces: the output must be f32 or f64, got ", dtype_name(out.dtype()));
    }
  });
}

}  // namespace ingot::kernels::cuda
