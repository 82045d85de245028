// CUDA row-wise kernels: softmax / log_softmax, LayerNorm and RMSNorm, forward and backward.
//
// Shapes (all contiguous): x, y, dy, dx are [rows, C]; w, b, dw, db are [C]; mean, rstd are [rows].
//
// Approach: one block per row (32..512 threads, sized to the row), each thread striding over the row in
// 16-byte packs when every row is 16-byte aligned (C a multiple of the pack), else element by element. Row
// statistics are warp-shuffle reductions combined across warps through shared memory. Softmax keeps an online
// (max, sum of exp) pair so the input is read twice (statistics, output) instead of three times. LayerNorm
// computes the mean first and then the centered variance (no E[x^2] - E[x]^2 cancellation); the re-reads hit
// L1/L2. Math runs in f32 for f32/bf16/f16 and in f64 for f64.
//
// The parameter gradients dw, db sum over rows. A 2-D grid of (32 columns x 8 row lanes) blocks each folds a
// chunk of rows into per-column partials (coalesced reads along the row), and a second kernel sums the
// partials of each column in a fixed order: deterministic, no atomics.
#include <algorithm>

#include "runtime/kernels/cuda/row_common.cuh"
#include "runtime/kernels/kernels.h"

namespace ingot::kernels::cuda {
namespace {

using namespace rowwise;

// kernels -----------------------------------------------------------------------------------------------------

// y[r] = softmax(x[r]) or log_softmax(x[r]).
template <typename T, int V>
__global__ void softmax_fwd_kernel(T* y, const T* x, int64_t C, bool log) {
  using A = acc_t<T>;
  __shared__ A smem[64];
  const T* xr = x + blockIdx.x * C;
  T* yr = y + blockIdx.x * C;
  A m = neg_inf<A>(), s = 0;
  for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
    A v[V];
    load_vec<V>(xr + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) lse_push(m, s, v[k]);
  }
  block_lse(m, s, smem);
  const A log_s = dlog(s), inv_s = A(1) / s;
  for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
    A v[V];
    load_vec<V>(xr + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = log ? v[k] - m - log_s : dexp(v[k] - m) * inv_s;
    store_vec<V>(yr + i, v);
  }
}

// softmax:     dx = y * (dy - sum(dy * y))
// log_softmax: dx = dy - exp(y) * sum(dy)
template <typename T, int V>
__global__ void softmax_bwd_kernel(T* dx, const T* dy, const T* y, int64_t C, bool log) {
  using A = acc_t<T>;
  __shared__ A smem[32];
  const int64_t off = blockIdx.x * C;
  A acc[1] = {0};
  for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
    A g[V], o[V];
    load_vec<V>(dy + off + i, g);
    load_vec<V>(y + off + i, o);
#pragma unroll
    for (int k = 0; k < V; ++k) acc[0] += log ? g[k] : g[k] * o[k];
  }
  block_sum(acc, smem);
  for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
    A g[V], o[V];
    load_vec<V>(dy + off + i, g);
    load_vec<V>(y + off + i, o);
#pragma unroll
    for (int k = 0; k < V; ++k) g[k] = log ? g[k] - dexp(o[k]) * acc[0] : o[k] * (g[k] - acc[0]);
    store_vec<V>(dx + off + i, g);
  }
}

// LayerNorm (kCenter) or RMSNorm forward. mean (LayerNorm only) and rstd may be null.
template <typename T, int V, bool kCenter>
__global__ void norm_fwd_kernel(T* y, void* mean, void* rstd, DType stat_dt, const T* x, const void* w, DType w_dt,
                                const void* b, DType b_dt, int64_t C, double eps) {
  using A = acc_t<T>;
  __shared__ A smem[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  T* yr = y + row * C;
  A mu = 0;
  if constexpr (kCenter) {
    A acc[1] = {0};
    for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
      A v[V];
      load_vec<V>(xr + i, v);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[0] += v[k];
    }
    block_sum(acc, smem);
    mu = acc[0] / static_cast<A>(C);
  }
  A sq[1] = {0};
  for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
    A v[V];
    load_vec<V>(xr + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) sq[0] += (v[k] - mu) * (v[k] - mu);
  }
  block_sum(sq, smem);
  const A rs = drsqrt(sq[0] / static_cast<A>(C) + static_cast<A>(eps));
  if (threadIdx.x == 0) {
    if (kCenter && mean) store_dyn(mean, stat_dt, row, mu);
    if (rstd) store_dyn(rstd, stat_dt, row, rs);
  }
  for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
    A v[V];
    load_vec<V>(xr + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A o = (v[k] - mu) * rs;
      if (w) o *= load_dyn<A>(w, w_dt, i + k);
      if (b) o += load_dyn<A>(b, b_dt, i + k);
      v[k] = o;
    }
    store_vec<V>(yr + i, v);
  }
}

// dx of LayerNorm (kCenter) or RMSNorm, with g = dy * w and xhat = (x - mean) * rstd:
//   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat))
template <typename T, int V, bool kCenter>
__global__ void norm_bwd_dx_kernel(T* dx, const T* dy, const T* x, const void* mean, const void* rstd, DType stat_dt,
                                   const void* w, DType w_dt, int64_t C) {
  using A = acc_t<T>;
  __shared__ A smem[64];
  const int64_t row = blockIdx.x, off = row * C;
  const A mu = kCenter ? load_dyn<A>(mean, stat_dt, row) : A(0);
  const A rs = load_dyn<A>(rstd, stat_dt, row);
  A acc[2] = {0, 0};  // sum(g), sum(g * xhat)
  for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
    A g[V], v[V];
    load_vec<V>(dy + off + i, g);
    load_vec<V>(x + off + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A gk = w ? g[k] * load_dyn<A>(w, w_dt, i + k) : g[k];
      acc[0] += gk;
      acc[1] += gk * (v[k] - mu) * rs;
    }
  }
  block_sum(acc, smem);
  const A mean_g = kCenter ? acc[0] / static_cast<A>(C) : A(0), mean_gx = acc[1] / static_cast<A>(C);
  for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
    A g[V], v[V];
    load_vec<V>(dy + off + i, g);
    load_vec<V>(x + off + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A gk = w ? g[k] * load_dyn<A>(w, w_dt, i + k) : g[k];
      v[k] = rs * (gk - mean_g - (v[k] - mu) * rs * mean_gx);
    }
    store_vec<V>(dx + off + i, v);
  }
}

constexpr int kColTile = 32, kRowLanes = 8;

// Per-column partial sums of dy * xhat (into pw) and dy (into pb, when non-null) over one chunk of rows.
// Block (32, 8); grid (ceil(C / 32), chunks). Partials are [chunks, C].
template <typename T, bool kCenter>
__global__ void norm_param_partial_kernel(acc_t<T>* pw, acc_t<T>* pb, const T* dy, const T* x, const void* mean,
                                          const void* rstd, DType stat_dt, int64_t rows, int64_t C,
                                          int64_t rows_per_chunk) {
  using A = acc_t<T>;
  __shared__ A sw[kRowLanes][kColTile + 1], sb[kRowLanes][kColTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = blockIdx.x * int64_t(kColTile) + tx;
  const int64_t r0 = blockIdx.y * rows_per_chunk, r1 = std::min(rows, r0 + rows_per_chunk);
  A aw = 0, ab = 0;
  if (c < C) {
    for (int64_t r = r0 + ty; r < r1; r += kRowLanes) {
      A mu = kCenter ? load_dyn<A>(mean, stat_dt, r) : A(0);
      A g = to_acc<A>(dy[r * C + c]);
      aw += g * (to_acc<A>(x[r * C + c]) - mu) * load_dyn<A>(rstd, stat_dt, r);
      ab += g;
    }
  }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && c < C) {
    for (int k = 1; k < kRowLanes; ++k) {
      aw += sw[k][tx];
      ab += sb[k][tx];
    }
    pw[blockIdx.y * C + c] = aw;
    if (pb) pb[blockIdx.y * C + c] = ab;
  }
}

// out[c] = sum over chunks of partial[chunk, c], in chunk order.
template <typename A>
__global__ void column_sum_kernel(void* out, DType out_dt, const A* partial, int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  A s = 0;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * C + c];
  store_dyn(out, out_dt, c, s);
}

// launchers ---------------------------------------------------------------------------------------------------

void check_row_pair(const Tensor& a, const Tensor& b, const char* op, const char* na, const char* nb) {
  check_cuda_contig(a, op, na);
  check_cuda_contig(b, op, nb);
  INGOT_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(), op, ": expected ", na, " and ", nb,
              " of one shape and dtype, got ", shape_str(a.shape()), " ", dtype_name(a.dtype()), " and ",
              shape_str(b.shape()), " ", dtype_name(b.dtype()));
}

void check_param(const Tensor& p, int64_t C, const char* op, const char* name) {
  if (!p.defined()) return;
  check_cuda_contig(p, op, name);
  INGOT_CHECK(p.numel() == C && is_floating(p.dtype()), op, ": expected ", name, " a floating tensor of ", C,
              " elements, got ", shape_str(p.shape()), " ", dtype_name(p.dtype()));
}

void check_stat(const Tensor& s, int64_t rows, const char* op, const char* name) {
  if (!s.defined()) return;
  check_cuda_contig(s, op, name);
  INGOT_CHECK(s.numel() == rows && (s.dtype() == DType::f32 || s.dtype() == DType::f64), op, ": expected ", name,
              " f32 [", rows, "], got ", shape_str(s.shape()), " ", dtype_name(s.dtype()));
}

// Launches one block per row, with the row's pack width chosen from C and the pointers' alignment.
template <typename T, typename F>
void launch_rows(int64_t C, std::initializer_list<const void*> ptrs, F&& f) {
  dispatch_vec<T>(vec_width<T>(C, ptrs), [&](auto vec) {
    constexpr int V = decltype(vec)::value;
    f(vec, row_threads((C + V - 1) / V));
  });
}

// dw (and db when defined) = column sums of dy * xhat (and dy) over all rows.
template <typename T, bool kCenter>
void norm_param_grads(const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& mean,
                      const Tensor& rstd, int64_t rows, int64_t C, cudaStream_t stream) {
  using A = acc_t<T>;
  const DType acc_dt = std::is_same_v<A, double> ? DType::f64 : DType::f32;
  const int64_t col_blocks = (C + kColTile - 1) / kColTile;
  // Enough blocks to fill the GPU several times over, each folding at least 32 rows.
  const int64_t want_chunks = std::max<int64_t>(1, 2048 / col_blocks);
  const int64_t rows_per_chunk = std::max<int64_t>(32, (rows + want_chunks - 1) / want_chunks);
  const int64_t chunks = std::max<int64_t>(1, (rows + rows_per_chunk - 1) / rows_per_chunk);
  Tensor partial = empty({db.defined() ? 2 : 1, chunks, C}, acc_dt, dy.device());
  A* pw = partial.data<A>();
  A* pb = db.defined() ? pw + chunks * C : nullptr;
  norm_param_partial_kernel<T, kCenter><<<dim3(col_blocks, chunks), dim3(kColTile, kRowLanes), 0, stream>>>(
      pw, pb, dy.data<T>(), x.data<T>(), kCenter ? mean.data_ptr() : nullptr, rstd.data_ptr(), rstd.dtype(), rows,
      C, rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  const int threads = 256;
  const unsigned grid = static_cast<unsigned>((C + threads - 1) / threads);
  if (dw.defined()) {
    column_sum_kernel<A><<<grid, threads, 0, stream>>>(dw.data_ptr(), dw.dtype(), pw, chunks, C);
    CUDA_CHECK_LAUNCH();
  }
  if (db.defined()) {
    column_sum_kernel<A><<<grid, threads, 0, stream>>>(db.data_ptr(), db.dtype(), pb, chunks, C);
    CUDA_CHECK_LAUNCH();
  }
}

template <bool kCenter>
void norm_fwd(const char* op, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
              const Tensor& w, const Tensor& b, double eps) {
  check_row_pair(y, x, op, "y", "x");
  const int64_t C = x.dim() == 0 ? 1 : x.size(-1), rows = C == 0 ? 0 : x.numel() / C;
  check_param(w, C, op, "w");
  check_param(b, C, op, "b");
  check_stat(mean, rows, op, "mean");
  check_stat(rstd, rows, op, "rstd");
  INGOT_CHECK(!mean.defined() || !rstd.defined() || mean.dtype() == rstd.dtype(), op,
              ": expected mean and rstd of one dtype");
  if (rows == 0) return;
  LaunchContext L(x);
  const DType stat_dt = rstd.defined() ? rstd.dtype() : dtype_or_f32(mean);
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    launch_rows<T>(C, {x.data_ptr(), y.data_ptr()}, [&](auto vec, int threads) {
      norm_fwd_kernel<T, decltype(vec)::value, kCenter><<<rows, threads, 0, L.stream>>>(
          y.data<T>(), mut_ptr_or_null(mean), mut_ptr_or_null(rstd), stat_dt, x.data<T>(), ptr_or_null(w),
          dtype_or_f32(w), ptr_or_null(b), dtype_or_f32(b), C, eps);
      CUDA_CHECK_LAUNCH();
    });
  });
}

template <bool kCenter>
void norm_bwd(const char* op, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
              const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w) {
  check_row_pair(dy, x, op, "dy", "x");
  if (dx.defined()) check_row_pair(dx, x, op, "dx", "x");
  const int64_t C = x.dim() == 0 ? 1 : x.size(-1), rows = C == 0 ? 0 : x.numel() / C;
  check_param(w, C, op, "w");
  check_param(dw, C, op, "dw");
  check_param(db, C, op, "db");
  INGOT_CHECK(rstd.defined() && (!kCenter || mean.defined()), op, ": expected the saved statistics");
  check_stat(mean, rows, op, "mean");
  check_stat(rstd, rows, op, "rstd");
  if (C == 0) return;
  LaunchContext L(x);
  if (rows == 0) {  // empty batch: the parameter gradients are zero
    if (dw.defined()) CUDA_CHECK(cudaMemsetAsync(dw.data_ptr(), 0, dw.nbytes(), L.stream));
    if (db.defined()) CUDA_CHECK(cudaMemsetAsync(db.data_ptr(), 0, db.nbytes(), L.stream));
    return;
  }
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    if (dx.defined()) {
      launch_rows<T>(C, {x.data_ptr(), dy.data_ptr(), dx.data_ptr()}, [&](auto vec, int threads) {
        norm_bwd_dx_kernel<T, decltype(vec)::value, kCenter><<<rows, threads, 0, L.stream>>>(
            dx.data<T>(), dy.data<T>(), x.data<T>(), ptr_or_null(mean), rstd.data_ptr(), rstd.dtype(),
            ptr_or_null(w), dtype_or_f32(w), C);
        CUDA_CHECK_LAUNCH();
      });
    }
    if (dw.defined() || db.defined()) norm_param_grads<T, kCenter>(dw, db, dy, x, mean, rstd, rows, C, L.stream);
  });
}

}  // namespace

void softmax_fwd(const Tensor& y, const Tensor& x, bool log) {
  check_row_pair(y, x, "softmax_fwd", "y", "x");
  const int64_t C = x.dim() == 0 ? 1 : x.size(-1), rows = C == 0 ? 0 : x.numel() / C;
  if (rows == 0) return;
  LaunchContext L(x);
  dispatch_float(x.dtype(), "softmax_fwd", [&](auto tag) {
    using T = decltype(tag);
    launch_rows<T>(C, {x.data_ptr(), y.data_ptr()}, [&](auto vec, int threads) {
      softmax_fwd_kernel<T, decltype(vec)::value><<<rows, threads, 0, L.stream>>>(y.data<T>(), x.data<T>(), C, log);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void softmax_bwd(const Tensor& dx, const Tensor& dy, const Tensor& y, bool log) {
  check_row_pair(dx, y, "softmax_bwd", "dx", "y");
  check_row_pair(dy, y, "softmax_bwd", "dy", "y");
  const int64_t C = y.dim() == 0 ? 1 : y.size(-1), rows = C == 0 ? 0 : y.numel() / C;
  if (rows == 0) return;
  LaunchContext L(y);
  dispatch_float(y.dtype(), "softmax_bwd", [&](auto tag) {
    using T = decltype(tag);
    launch_rows<T>(C, {dx.data_ptr(), dy.data_ptr(), y.data_ptr()}, [&](auto vec, int threads) {
      softmax_bwd_kernel<T, decltype(vec)::value><<<rows, threads, 0, L.stream>>>(dx.data<T>(), dy.data<T>(),
                                                                                  y.data<T>(), C, log);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void layer_norm_fwd(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& w,
                    const Tensor& b, double eps) {
  norm_fwd<true>("layer_norm_fwd", y, mean, rstd, x, w, b, eps);
}

void layer_norm_bwd(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                    const Tensor& mean, const Tensor& rstd, const Tensor& w) {
  norm_bwd<true>("layer_norm_bwd", dx, dw, db, dy, x, mean, rstd, w);
}

void rms_norm_fwd(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  norm_fwd<false>("rms_norm_fwd", y, Tensor(), rstd, x, w, Tensor(), eps);
}

void rms_norm_bwd(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                  const Tensor& w) {
  norm_bwd<false>("rms_norm_bwd", dx, dw, Tensor(), dy, x, Tensor(), rstd, w);
}

}  // namespace ingot::kernels::cuda
