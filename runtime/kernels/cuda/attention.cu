// CUDA transformer pieces: rotary embeddings and scaled dot-product attention, forward and backward.
//
// Note [Attention layouts]: q, k, v, out, dout, dq, dk, dv may have any strides (lse is contiguous). cuDNN
// reads and writes them in place when its layout rules allow (attention_cudnn.cu, Note [Layouts]); otherwise
// the kernels run on contiguous copies and the results are copied into the callers' layouts.
//
// Shapes: q, out, dq, dout [B, Hq, T, D]; k, v, dk, dv [B, Hkv, S, D] with Hq % Hkv == 0 (grouped
// query attention: q head h reads kv head h / (Hq / Hkv)); lse [B, Hq, T] (f32, or f64); rope's cos, sin [T, D/2]
// or [B, T, D/2] (per-row positions). Causal attention masks key j for query i when j > i + (S - T). A query that
// sees no key (causal with T > S) gets out = 0 and lse = -inf, and contributes nothing to the gradients.
// Packed documents: with positions (i64 [B, T], each query's position within its document) query i of row b
// also masks the keys before its document, j < i + (S - T) - positions[b, i]. Only the kernels below implement
// it (cuDNN's ragged offsets are not wired in): auto takes them for such calls, INGOT_ATTENTION=cudnn refuses.
//
// Two implementations, chosen by INGOT_ATTENTION=cudnn|fallback|auto (default auto), for forward and backward:
//  - cudnn: cuDNN's fused flash attention (attention_cudnn.cu) for bf16/f16, D <= 128 (a multiple of 8), causal
//    only with T == S; cudnn makes any other case an error, auto takes the kernels below for it (and for a
//    graph the installed cuDNN rejects). Both write and read the same lse, so they mix freely.
//  - fallback, here: flash-attention-style tiled kernels in the compute type (f32 for f32/bf16/f16, f64 for f64),
//    any D <= 256. Forward: a block owns Br = 4 * warps query rows of one (b, h); each warp owns 4 rows and each
//    lane one key of the current 32-key tile; scores are dot products out of shared memory (K rows padded by one
//    element, so the 32 lanes hit 32 banks), then an online softmax keeps each row's running max m and sum l
//    and rescales the output accumulators, which live in registers (lane owns d = lane + 32 j). lse = m + log l.
//    Backward recomputes P = exp(scale * q.k - lse) instead of storing it (FlashAttention-2):
//      delta_i = dout_i . out_i
//      dS_ij = P_ij (dout_i . v_j - delta_i)
//      dq_i = scale sum_j dS_ij k_j,   dk_j = scale sum_i dS_ij q_i,   dv_j = sum_i P_ij dout_i
//    in two kernels with no atomics (deterministic): one owns query rows and sweeps keys (dq), the other owns
//    key rows and sweeps the queries of every q head of its kv group (dk, dv), so GQA sums happen in registers.
//    Causal tiles entirely above the diagonal are skipped.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/kernels/cuda/attention_cudnn.h"
#include "runtime/kernels/cuda/row_common.cuh"
#include "runtime/kernels/kernels.h"

namespace ingot::kernels::cuda {
namespace {

using namespace rowwise;

constexpr int kRows = 4;   // query (or key) rows per warp
constexpr int kTile = 32;  // keys (or queries) per tile: one per lane

struct AttnDims {
  int64_t B, Hq, Hkv, T, S;
  int D;
  bool causal;
  double scale;
  const int64_t* positions;  // [B, T] or nullptr
};

// Whether query i of batch row b sees key j (both possibly past the end, which nothing sees).
__device__ __forceinline__ bool sees(const AttnDims& p, int64_t b, int64_t i, int64_t j) {
  if (i >= p.T || j >= p.S) return false;
  if (!p.causal) return true;
  const int64_t diag = i + p.S - p.T;
  return j <= diag && (p.positions == nullptr || j >= diag - p.positions[b * p.T + i]);
}

// rope --------------------------------------------------------------------------------------------------------

// Where row `row` ((b * H + h) * T + t) of a [B, H, T, D] operand starts, in elements, given its strides of b, h
// and t (the last dim is dense: Note [Rope keeps the token-major layout], autograd/ops/attention.cpp).
struct RopeRows {
  int64_t H, T;
  int64_t xs[3], os[3];
  bool contiguous;  // both [B, H, T, D] contiguous: a row starts at row * D, no division
  __device__ void offsets(int64_t row, int64_t D, int64_t* xo, int64_t* oo) const {
    if (contiguous) {
      *xo = *oo = row * D;
      return;
    }
    const int64_t t = row % T, bh = row / T, h = bh % H, b = bh / H;
    *xo = b * xs[0] + h * xs[1] + t * xs[2];
    *oo = b * os[0] + h * os[1] + t * os[2];
  }
};

// One thread per rotated pair (i, i + D/2) of one row; reads both before writing, so out may alias x (same strides).
// rows_per_batch = H * T when the tables are per batch row ([B, T, D/2]), 0 for one shared table. y: null, or an
// addend laid out as x (Note [Rope of a sum], autograd/ops/attention.cpp): x + y is rotated, summed in f32.
template <typename T>
__global__ void rope_kernel(T* out, const T* x, const T* y, const void* cos, const void* sin, DType cs_dt, RopeRows rr,
                            int64_t half, int64_t pairs, int64_t rows_per_batch, bool inverse) {
  using A = acc_t<T>;
  const int64_t T_len = rr.T;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < pairs; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % half, row = e / half;
    const int64_t t = (rows_per_batch > 0 ? row / rows_per_batch * T_len : 0) + row % T_len;
    const A c = load_dyn<A>(cos, cs_dt, t * half + i);
    const A s = inverse ? -load_dyn<A>(sin, cs_dt, t * half + i) : load_dyn<A>(sin, cs_dt, t * half + i);
    int64_t xo, oo;
    rr.offsets(row, 2 * half, &xo, &oo);
    A a = to_acc<A>(x[xo + i]), b = to_acc<A>(x[xo + i + half]);
    if (y) {
      a += to_acc<A>(y[xo + i]);
      b += to_acc<A>(y[xo + i + half]);
    }
    out[oo + i] = from_acc<T>(a * c - b * s);
    out[oo + i + half] = from_acc<T>(b * c + a * s);
  }
}

// The rows of a [B, H, T, D] operand in its storage order: the three row dims (b, h, t) sorted by x's stride,
// outermost first. A token-major operand ([B, T, H, D] memory seen as [B, H, T, D]) is walked token by token, each
// token's heads side by side, so consecutive threads read consecutive bytes and the threads of one token share its
// cos / sin row (L1) instead of every warp fetching four tokens' rows.
struct RopeOrder {
  uint32_t n[3];         // sizes, outer to inner
  int64_t xs[3], os[3];  // strides in x and out, in that order
  int t_at, b_at;        // where t and b are among the three
};

// The same rotation, V consecutive pairs per thread as 16-byte loads and stores (V = 8 for 2-byte types, 4 for
// f32) with f32 tables read as 16-byte vectors, rows walked in storage order (RopeOrder) with 32-bit index math.
// The per-pair kernel was ~5x slower than its bytes (8B Llama LoRA on an H100: 128 calls, 9.0 of 288 ms;
// bench/RESULTS.md 2026-11-26), the first vectorized one, walking [B, H, T] order over token-major memory, ~4x
// (63 us for the 8B's 33.5 MB q on an H200, 2026-11-27). Same arithmetic per element as rope_kernel. Needs
// half % V == 0, 16-byte aligned x, out and tables, row strides that are multiples of V, and < 2^31 vectors.
template <typename T, int V>
__global__ void rope_vec_kernel(T* out, const T* x, const T* y, const float* cos, const float* sin, RopeOrder ro,
                                uint32_t half, uint32_t groups, uint32_t T_len, bool per_row_tables, bool inverse) {
  using A = acc_t<T>;
  static_assert(sizeof(T) * V == 16, "one 16-byte vector per half row");
  struct alignas(16) Vec {
    T v[V];
  };
  struct alignas(16) Tab {
    float v[V];
  };
  const uint32_t per_row = half / V;
  for (uint32_t g = blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += gridDim.x * blockDim.x) {
    uint32_t r = g / per_row;
    const uint32_t i0 = (g - r * per_row) * V;
    uint32_t idx[3];
    idx[2] = r % ro.n[2];
    r /= ro.n[2];
    idx[1] = r % ro.n[1];
    idx[0] = r / ro.n[1];
    const int64_t xo = idx[0] * ro.xs[0] + idx[1] * ro.xs[1] + idx[2] * ro.xs[2];
    const int64_t oo = idx[0] * ro.os[0] + idx[1] * ro.os[1] + idx[2] * ro.os[2];
    const int64_t trow = (per_row_tables ? int64_t(idx[ro.b_at]) * T_len : 0) + idx[ro.t_at];
    const Tab c = *reinterpret_cast<const Tab*>(cos + trow * half + i0);
    const Tab sn = *reinterpret_cast<const Tab*>(sin + trow * half + i0);
    const Vec a = *reinterpret_cast<const Vec*>(x + xo + i0), b = *reinterpret_cast<const Vec*>(x + xo + i0 + half);
    Vec ya{}, yb{};
    if (y) {
      ya = *reinterpret_cast<const Vec*>(y + xo + i0);
      yb = *reinterpret_cast<const Vec*>(y + xo + i0 + half);
    }
    Vec oa, ob;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A ck = c.v[k];
      const A sk = inverse ? -A(sn.v[k]) : A(sn.v[k]);
      A av = to_acc<A>(a.v[k]), bv = to_acc<A>(b.v[k]);
      if (y) {
        av += to_acc<A>(ya.v[k]);
        bv += to_acc<A>(yb.v[k]);
      }
      oa.v[k] = from_acc<T>(av * ck - bv * sk);
      ob.v[k] = from_acc<T>(bv * ck + av * sk);
    }
    *reinterpret_cast<Vec*>(out + oo + i0) = oa;
    *reinterpret_cast<Vec*>(out + oo + i0 + half) = ob;
  }
}

// attention forward ---------------------------------------------------------------------------------------------

// Grid (ceil(T / Br), B * Hq), block 32 * warps. Shared: Q [Br][D], K [32][D + 1], V [32][D] in A.
template <typename T, int kDL>
__global__ void attn_fwd_kernel(T* out, void* lse, DType lse_dt, const T* q, const T* k, const T* v, AttnDims p) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* smem = reinterpret_cast<A*>(smem_raw);
  const int D = p.D, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nthreads = blockDim.x;
  const int Br = (blockDim.x >> 5) * kRows;
  A* Qs = smem;
  A* Ks = Qs + Br * D;
  A* Vs = Ks + kTile * (D + 1);
  const int64_t bh = blockIdx.y, b = bh / p.Hq, h = bh % p.Hq, hk = h / (p.Hq / p.Hkv);
  const int64_t i0 = blockIdx.x * int64_t(Br), offset = p.S - p.T;
  const T* qb = q + bh * p.T * D;
  const T* kb = k + (b * p.Hkv + hk) * p.S * D;
  const T* vb = v + (b * p.Hkv + hk) * p.S * D;
  for (int e = threadIdx.x; e < Br * D; e += nthreads) {
    const int r = e / D;
    Qs[e] = i0 + r < p.T ? to_acc<A>(qb[(i0 + r) * D + e % D]) : A(0);
  }
  A m[kRows], l[kRows], acc[kRows][kDL];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = neg_inf<A>();
    l[r] = 0;
#pragma unroll
    for (int j = 0; j < kDL; ++j) acc[r][j] = 0;
  }
  // Keys past the last row's diagonal are masked for every row of this block.
  int64_t j_end = p.S;
  if (p.causal) j_end = std::max<int64_t>(0, std::min<int64_t>(p.S, i0 + Br + offset));
  const A scale = static_cast<A>(p.scale);
  for (int64_t j0 = 0; j0 < j_end; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and, first time, Q is stored)
    for (int e = threadIdx.x; e < kTile * D; e += nthreads) {
      const int r = e / D, d = e % D;
      const bool in = j0 + r < p.S;
      Ks[r * (D + 1) + d] = in ? to_acc<A>(kb[(j0 + r) * D + d]) : A(0);
      Vs[r * D + d] = in ? to_acc<A>(vb[(j0 + r) * D + d]) : A(0);
    }
    __syncthreads();
    A s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = 0;
    const A* krow = Ks + lane * (D + 1);
    const A* qrow = Qs + warp * kRows * D;
    for (int d = 0; d < D; ++d) {
      const A kd = krow[d];
#pragma unroll
      for (int r = 0; r < kRows; ++r) s[r] += qrow[r * D + d] * kd;
    }
    const int64_t j = j0 + lane;
    A pr[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t i = i0 + warp * kRows + r;
      const bool valid = sees(p, b, i, j);
      const A sc = valid ? s[r] * scale : neg_inf<A>();
      const A m_new = fmax(m[r], warp_max(sc));
      A alpha = 1;
      if (m_new == neg_inf<A>()) {
        pr[r] = 0;  // nothing visible yet for this row
      } else {
        pr[r] = valid ? dexp(sc - m_new) : A(0);
        alpha = dexp(m[r] - m_new);  // 0 when m was -inf
      }
      l[r] = l[r] * alpha + warp_sum(pr[r]);
      m[r] = m_new;
#pragma unroll
      for (int jd = 0; jd < kDL; ++jd) acc[r][jd] *= alpha;
    }
    for (int c = 0; c < kTile; ++c) {
      A vv[kDL];
#pragma unroll
      for (int jd = 0; jd < kDL; ++jd) {
        const int d = lane + 32 * jd;
        vv[jd] = d < D ? Vs[c * D + d] : A(0);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const A pc = __shfl_sync(0xffffffffu, pr[r], c);
#pragma unroll
        for (int jd = 0; jd < kDL; ++jd) acc[r][jd] += pc * vv[jd];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = i0 + warp * kRows + r;
    if (i >= p.T) continue;
    const A inv = l[r] > A(0) ? A(1) / l[r] : A(0);
#pragma unroll
    for (int jd = 0; jd < kDL; ++jd) {
      const int d = lane + 32 * jd;
      if (d < D) out[(bh * p.T + i) * D + d] = from_acc<T>(acc[r][jd] * inv);
    }
    if (lane == 0) store_dyn(lse, lse_dt, bh * p.T + i, l[r] > A(0) ? m[r] + dlog(l[r]) : neg_inf<A>());
  }
}

// attention backward --------------------------------------------------------------------------------------------

// delta[row] = dout[row] . out[row]; one warp per row of D.
template <typename T>
__global__ void attn_delta_kernel(acc_t<T>* delta, const T* dout, const T* out, int64_t rows, int D) {
  using A = acc_t<T>;
  const int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  A s = 0;
  for (int d = lane; d < D; d += 32) s += to_acc<A>(dout[row * D + d]) * to_acc<A>(out[row * D + d]);
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

// P_ij and dS_ij for one (query i, key j) pair, given their dot products, or zeros when masked.
template <typename A>
__device__ __forceinline__ void probs(A qk, A dov, A lse_i, A delta_i, bool valid, A scale, A& pij, A& dsij) {
  pij = valid && lse_i != neg_inf<A>() ? dexp(qk * scale - lse_i) : A(0);
  dsij = pij * (dov - delta_i);
}

// dq. Grid (ceil(T / Br), B * Hq). Shared: Q, dO [Br][D]; K, V [32][D + 1].
template <typename T, int kDL>
__global__ void attn_bwd_dq_kernel(T* dq, const T* q, const T* k, const T* v, const T* dout, const void* lse,
                                   DType lse_dt, const acc_t<T>* delta, AttnDims p) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* smem = reinterpret_cast<A*>(smem_raw);
  const int D = p.D, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nthreads = blockDim.x;
  const int Br = (blockDim.x >> 5) * kRows;
  A* Qs = smem;
  A* dOs = Qs + Br * D;
  A* Ks = dOs + Br * D;
  A* Vs = Ks + kTile * (D + 1);
  const int64_t bh = blockIdx.y, b = bh / p.Hq, h = bh % p.Hq, hk = h / (p.Hq / p.Hkv);
  const int64_t i0 = blockIdx.x * int64_t(Br), offset = p.S - p.T;
  const T* kb = k + (b * p.Hkv + hk) * p.S * D;
  const T* vb = v + (b * p.Hkv + hk) * p.S * D;
  for (int e = threadIdx.x; e < Br * D; e += nthreads) {
    const int64_t i = i0 + e / D;
    const bool in = i < p.T;
    Qs[e] = in ? to_acc<A>(q[(bh * p.T + i) * D + e % D]) : A(0);
    dOs[e] = in ? to_acc<A>(dout[(bh * p.T + i) * D + e % D]) : A(0);
  }
  A lse_r[kRows], delta_r[kRows], acc[kRows][kDL];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = i0 + warp * kRows + r;
    lse_r[r] = i < p.T ? load_dyn<A>(lse, lse_dt, bh * p.T + i) : neg_inf<A>();
    delta_r[r] = i < p.T ? delta[bh * p.T + i] : A(0);
#pragma unroll
    for (int jd = 0; jd < kDL; ++jd) acc[r][jd] = 0;
  }
  int64_t j_end = p.S;
  if (p.causal) j_end = std::max<int64_t>(0, std::min<int64_t>(p.S, i0 + Br + offset));
  const A scale = static_cast<A>(p.scale);
  for (int64_t j0 = 0; j0 < j_end; j0 += kTile) {
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * D; e += nthreads) {
      const int r = e / D, d = e % D;
      const bool in = j0 + r < p.S;
      Ks[r * (D + 1) + d] = in ? to_acc<A>(kb[(j0 + r) * D + d]) : A(0);
      Vs[r * (D + 1) + d] = in ? to_acc<A>(vb[(j0 + r) * D + d]) : A(0);
    }
    __syncthreads();
    A qk[kRows], dov[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) qk[r] = dov[r] = 0;
    const A* krow = Ks + lane * (D + 1);
    const A* vrow = Vs + lane * (D + 1);
    for (int d = 0; d < D; ++d) {
      const A kd = krow[d], vd = vrow[d];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        qk[r] += Qs[(warp * kRows + r) * D + d] * kd;
        dov[r] += dOs[(warp * kRows + r) * D + d] * vd;
      }
    }
    const int64_t j = j0 + lane;
    A ds[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t i = i0 + warp * kRows + r;
      A pij;
      probs(qk[r], dov[r], lse_r[r], delta_r[r], sees(p, b, i, j), scale, pij, ds[r]);
    }
    for (int c = 0; c < kTile; ++c) {
      A kk[kDL];
#pragma unroll
      for (int jd = 0; jd < kDL; ++jd) {
        const int d = lane + 32 * jd;
        kk[jd] = d < D ? Ks[c * (D + 1) + d] : A(0);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const A dsc = __shfl_sync(0xffffffffu, ds[r], c);
#pragma unroll
        for (int jd = 0; jd < kDL; ++jd) acc[r][jd] += dsc * kk[jd];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = i0 + warp * kRows + r;
    if (i >= p.T) continue;
#pragma unroll
    for (int jd = 0; jd < kDL; ++jd) {
      const int d = lane + 32 * jd;
      if (d < D) dq[(bh * p.T + i) * D + d] = from_acc<T>(acc[r][jd] * scale);
    }
  }
}

// dk, dv. Grid (ceil(S / Bk), B * Hkv); a block owns Bk = 4 * warps keys of one kv head and sweeps every query
// of the q heads that share it. Shared: K, V [Bk][D]; Q, dO [32][D + 1]; lse, delta [32].
template <typename T, int kDL>
__global__ void attn_bwd_dkdv_kernel(T* dk, T* dv, const T* q, const T* k, const T* v, const T* dout,
                                     const void* lse, DType lse_dt, const acc_t<T>* delta, AttnDims p) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* smem = reinterpret_cast<A*>(smem_raw);
  const int D = p.D, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nthreads = blockDim.x;
  const int Bk = (blockDim.x >> 5) * kRows;
  A* Ks = smem;
  A* Vs = Ks + Bk * D;
  A* Qs = Vs + Bk * D;
  A* dOs = Qs + kTile * (D + 1);
  A* lse_s = dOs + kTile * (D + 1);
  A* delta_s = lse_s + kTile;
  const int64_t bhk = blockIdx.y, b = bhk / p.Hkv, hk = bhk % p.Hkv, group = p.Hq / p.Hkv;
  const int64_t j0 = blockIdx.x * int64_t(Bk), offset = p.S - p.T;
  const T* kb = k + bhk * p.S * D;
  const T* vb = v + bhk * p.S * D;
  for (int e = threadIdx.x; e < Bk * D; e += nthreads) {
    const int64_t j = j0 + e / D;
    const bool in = j < p.S;
    Ks[e] = in ? to_acc<A>(kb[j * D + e % D]) : A(0);
    Vs[e] = in ? to_acc<A>(vb[j * D + e % D]) : A(0);
  }
  A dk_acc[kRows][kDL], dv_acc[kRows][kDL];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int jd = 0; jd < kDL; ++jd) dk_acc[r][jd] = dv_acc[r][jd] = 0;
  // Query i sees key j when i >= j - offset: earlier query tiles are masked for every key of this block.
  const int64_t i_begin = p.causal ? std::max<int64_t>(0, j0 - offset) / kTile * kTile : 0;
  const A scale = static_cast<A>(p.scale);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const int64_t bh = b * p.Hq + h;
    for (int64_t i0 = i_begin; i0 < p.T; i0 += kTile) {
      __syncthreads();
      for (int e = threadIdx.x; e < kTile * D; e += nthreads) {
        const int r = e / D, d = e % D;
        const int64_t i = i0 + r;
        const bool in = i < p.T;
        Qs[r * (D + 1) + d] = in ? to_acc<A>(q[(bh * p.T + i) * D + d]) : A(0);
        dOs[r * (D + 1) + d] = in ? to_acc<A>(dout[(bh * p.T + i) * D + d]) : A(0);
      }
      if (threadIdx.x < kTile) {
        const int64_t i = i0 + threadIdx.x;
        lse_s[threadIdx.x] = i < p.T ? load_dyn<A>(lse, lse_dt, bh * p.T + i) : neg_inf<A>();
        delta_s[threadIdx.x] = i < p.T ? delta[bh * p.T + i] : A(0);
      }
      __syncthreads();
      A qk[kRows], dov[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) qk[r] = dov[r] = 0;
      const A* qrow = Qs + lane * (D + 1);
      const A* drow = dOs + lane * (D + 1);
      for (int d = 0; d < D; ++d) {
        const A qd = qrow[d], dd = drow[d];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          qk[r] += Ks[(warp * kRows + r) * D + d] * qd;
          dov[r] += Vs[(warp * kRows + r) * D + d] * dd;
        }
      }
      const int64_t i = i0 + lane;
      A pr[kRows], ds[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int64_t j = j0 + warp * kRows + r;
        probs(qk[r], dov[r], lse_s[lane], delta_s[lane], sees(p, b, i, j), scale, pr[r], ds[r]);
      }
      for (int c = 0; c < kTile; ++c) {
        A qq[kDL], oo[kDL];
#pragma unroll
        for (int jd = 0; jd < kDL; ++jd) {
          const int d = lane + 32 * jd;
          qq[jd] = d < D ? Qs[c * (D + 1) + d] : A(0);
          oo[jd] = d < D ? dOs[c * (D + 1) + d] : A(0);
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const A pc = __shfl_sync(0xffffffffu, pr[r], c), dsc = __shfl_sync(0xffffffffu, ds[r], c);
#pragma unroll
          for (int jd = 0; jd < kDL; ++jd) {
            dv_acc[r][jd] += pc * oo[jd];
            dk_acc[r][jd] += dsc * qq[jd];
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t j = j0 + warp * kRows + r;
    if (j >= p.S) continue;
#pragma unroll
    for (int jd = 0; jd < kDL; ++jd) {
      const int d = lane + 32 * jd;
      if (d < D) {
        dk[(bhk * p.S + j) * D + d] = from_acc<T>(dk_acc[r][jd] * scale);
        dv[(bhk * p.S + j) * D + d] = from_acc<T>(dv_acc[r][jd]);
      }
    }
  }
}

// launchers ---------------------------------------------------------------------------------------------------

constexpr int kMaxHeadDim = 256;

// Calls f(std::integral_constant<int, kDL>{}) with kDL = D / 32 rounded up to a power of two.
template <typename F>
void dispatch_head_dim(int D, F&& f) {
  if (D <= 32) f(std::integral_constant<int, 1>{});
  else if (D <= 64) f(std::integral_constant<int, 2>{});
  else if (D <= 128) f(std::integral_constant<int, 4>{});
  else f(std::integral_constant<int, 8>{});
}

// The most warps in {8, 4, 2, 1} whose shared memory (bytes(warps)) fits the device; raises the kernel's
// dynamic shared-memory limit to match.
template <typename Kernel, typename Bytes>
std::pair<int, size_t> fit_warps(Kernel kernel, Bytes bytes, const char* op) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const int optin = shared_bytes_optin(dev);
  for (int w = 8; w >= 1; w /= 2) {
    const size_t need = bytes(w);
    if (need <= static_cast<size_t>(optin)) {
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(need)));
      return {w, need};
    }
  }
  INGOT_FAIL(op, ": head dim too large for the fallback kernel's shared memory");
}

AttnDims check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                         const Tensor& positions, bool causal, double scale) {
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}})
    INGOT_CHECK(t->device().is_cuda(), op, ": expected ", name, " on a CUDA device, got ", t->device().str());
  check_cuda_contig(lse, op, "lse");
  INGOT_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": expected q, k, v of rank 4 [B, H, T, D], got ",
              shape_str(q.shape()), ", ", shape_str(k.shape()), ", ", shape_str(v.shape()));
  INGOT_CHECK(k.shape() == v.shape() && k.size(0) == q.size(0) && k.size(3) == q.size(3), op,
              ": expected k, v [B, Hkv, S, D] matching q ", shape_str(q.shape()), ", got ", shape_str(k.shape()),
              " and ", shape_str(v.shape()));
  INGOT_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, op, ": q heads (", q.size(1),
              ") must be a multiple of kv heads (", k.size(1), ")");
  INGOT_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), op, ": expected q, k, v of one dtype, got ",
              dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), ", ", dtype_name(v.dtype()));
  INGOT_CHECK(lse.shape() == Shape({q.size(0), q.size(1), q.size(2)}) &&
                  (lse.dtype() == DType::f32 || lse.dtype() == DType::f64),
              op, ": expected lse f32 [B, Hq, T] for q ", shape_str(q.shape()), ", got ", shape_str(lse.shape()), " ",
              dtype_name(lse.dtype()));
  if (positions.defined()) {
    check_cuda_contig(positions, op, "positions");
    INGOT_CHECK(causal && positions.dtype() == DType::i64 && positions.shape() == Shape({q.size(0), q.size(2)}), op,
                ": expected causal attention and positions i64 [", q.size(0), ", ", q.size(2), "], got ",
                dtype_name(positions.dtype()), shape_str(positions.shape()));
  }
  return AttnDims{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), static_cast<int>(q.size(3)), causal, scale,
                  positions.defined() ? positions.data<int64_t>() : nullptr};
}

void check_like(const char* op, const Tensor& a, const Tensor& like, const char* name) {
  INGOT_CHECK(a.device() == like.device(), op, ": expected ", name, " on ", like.device().str(), ", got ",
              a.device().str());
  INGOT_CHECK(a.shape() == like.shape() && a.dtype() == like.dtype(), op, ": expected ", name, " ",
              shape_str(like.shape()), " ", dtype_name(like.dtype()), ", got ", shape_str(a.shape()), " ",
              dtype_name(a.dtype()));
}

enum class AttnImpl { Auto, Cudnn, Fallback };

AttnImpl attention_impl() {
  const char* env = std::getenv("INGOT_ATTENTION");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return AttnImpl::Auto;
  if (std::strcmp(env, "cudnn") == 0) return AttnImpl::Cudnn;
  if (std::strcmp(env, "fallback") == 0) return AttnImpl::Fallback;
  INGOT_FAIL("INGOT_ATTENTION: expected cudnn, fallback or auto, got '", env, "'");
}

// Whether cuDNN ran `run` (its forward or backward): never under fallback; under cudnn it must (an
// unsupported case is an error); under auto it runs when the case is supported, and a graph cuDNN rejects
// falls back.
template <typename Run>
bool try_cudnn(const char* op, const Tensor& q, const Tensor& k, const Tensor& lse, const Tensor& positions,
               bool causal, Run run) {
  const AttnImpl impl = attention_impl();
  if (impl == AttnImpl::Fallback) return false;
  const std::string why = positions.defined() ? "packed documents (positions) run on the fallback kernels"
                                              : cudnn_attention::unsupported_reason(q, k, lse, causal);
  if (!why.empty()) {
    INGOT_CHECK(impl != AttnImpl::Cudnn, op, ": INGOT_ATTENTION=cudnn but cuDNN cannot run this case: ", why);
    return false;
  }
  if (impl == AttnImpl::Cudnn) {
    run();
    return true;
  }
  try {
    run();
    return true;
  } catch (const Error&) {
    return false;  // e.g. no engine for this shape in the installed cuDNN: the fallback computes the same thing
  }
}

void fallback_fwd(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                  const AttnDims& p, cudaStream_t stream) {
  dispatch_float(q.dtype(), "attention_fwd", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    dispatch_head_dim(p.D, [&](auto dl) {
      auto kernel = attn_fwd_kernel<T, decltype(dl)::value>;
      auto [warps, bytes] = fit_warps(kernel, [&](int w) {
        return (size_t(w) * kRows * p.D + kTile * (p.D + 1) + kTile * p.D) * sizeof(A);
      }, "attention_fwd");
      const int Br = warps * kRows;
      dim3 grid(static_cast<unsigned>((p.T + Br - 1) / Br), static_cast<unsigned>(p.B * p.Hq));
      kernel<<<grid, warps * 32, bytes, stream>>>(out.data<T>(), lse.data_ptr(), lse.dtype(), q.data<T>(),
                                                  k.data<T>(), v.data<T>(), p);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void fallback_bwd(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const AttnDims& p,
                  cudaStream_t stream) {
  const char* op = "attention_bwd";
  dispatch_float(q.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t rows = p.B * p.Hq * p.T;
    Tensor delta = empty({rows}, std::is_same_v<A, double> ? DType::f64 : DType::f32, q.device());
    attn_delta_kernel<T><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(delta.data<A>(), dout.data<T>(),
                                                                                    out.data<T>(), rows, p.D);
    CUDA_CHECK_LAUNCH();
    dispatch_head_dim(p.D, [&](auto dl) {
      constexpr int kDL = decltype(dl)::value;
      auto dq_kernel = attn_bwd_dq_kernel<T, kDL>;
      auto [wq, bq] = fit_warps(dq_kernel, [&](int w) {
        return (2 * size_t(w) * kRows * p.D + 2 * kTile * (p.D + 1)) * sizeof(A);
      }, op);
      const int Br = wq * kRows;
      dim3 gq(static_cast<unsigned>((p.T + Br - 1) / Br), static_cast<unsigned>(p.B * p.Hq));
      dq_kernel<<<gq, wq * 32, bq, stream>>>(dq.data<T>(), q.data<T>(), k.data<T>(), v.data<T>(), dout.data<T>(),
                                             lse.data_ptr(), lse.dtype(), delta.data<A>(), p);
      CUDA_CHECK_LAUNCH();
      auto kv_kernel = attn_bwd_dkdv_kernel<T, kDL>;
      auto [wk, bk] = fit_warps(kv_kernel, [&](int w) {
        return (2 * size_t(w) * kRows * p.D + 2 * kTile * (p.D + 1) + 2 * kTile) * sizeof(A);
      }, op);
      const int Bk = wk * kRows;
      dim3 gk(static_cast<unsigned>((p.S + Bk - 1) / Bk), static_cast<unsigned>(p.B * p.Hkv));
      kv_kernel<<<gk, wk * 32, bk, stream>>>(dk.data<T>(), dv.data<T>(), q.data<T>(), k.data<T>(), v.data<T>(),
                                             dout.data<T>(), lse.data_ptr(), lse.dtype(), delta.data<A>(), p);
      CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace

void rope(const Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse,
          const Tensor& addend) {
  const char* op = "rope";
  check_same_device(op, {&out, &x, &cos, &sin});
  const bool sum = addend.defined();
  if (sum) {
    check_same_device(op, {&x, &addend});
    INGOT_CHECK(addend.shape() == x.shape() && addend.dtype() == x.dtype() && addend.strides() == x.strides(), op,
                ": the addend needs x's shape, dtype and strides, got ", shape_str(addend.shape()), " ",
                dtype_name(addend.dtype()), " for x ", shape_str(x.shape()), " ", dtype_name(x.dtype()));
  }
  INGOT_CHECK(x.device().is_cuda() && x.dim() == 4 && out.dim() == 4 && x.stride(3) == 1 && out.stride(3) == 1, op,
              ": expected CUDA x and out [B, H, T, D] with a dense last dim");
  check_cuda_contig(cos, op, "cos");
  check_cuda_contig(sin, op, "sin");
  INGOT_CHECK(x.dim() == 4 && out.shape() == x.shape() && out.dtype() == x.dtype() && x.size(3) % 2 == 0, op,
              ": expected x and out [B, H, T, D] with even D and one dtype, got ", shape_str(x.shape()), " and ",
              shape_str(out.shape()));
  const int64_t T_len = x.size(2), half = x.size(3) / 2;
  const bool per_row = cos.dim() == 3;
  const int64_t table = (per_row ? x.size(0) : 1) * T_len * half;
  INGOT_CHECK(cos.numel() == table && sin.numel() == table && is_floating(cos.dtype()) && cos.dtype() == sin.dtype(),
              op, ": expected cos, sin [", T_len, ", ", half, "] (or [", x.size(0), ", ", T_len, ", ", half,
              "] per row) of one float dtype, got ", shape_str(cos.shape()), " and ", shape_str(sin.shape()));
  const int64_t pairs = x.numel() / 2;
  if (pairs == 0) return;
  LaunchContext L(x);
  const int64_t rows_per_batch = per_row ? x.size(1) * T_len : 0;
  RopeRows rr{x.size(1), T_len, {x.stride(0), x.stride(1), x.stride(2)}, {out.stride(0), out.stride(1), out.stride(2)},
              x.is_contiguous() && out.is_contiguous()};
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const T* y = sum ? addend.data<T>() : nullptr;
    bool aligned = reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(sum ? addend.data_ptr() : x.data_ptr()) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(cos.data_ptr()) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(sin.data_ptr()) % 16 == 0;
    for (int k = 0; k < 3; ++k) aligned = aligned && rr.xs[k] % V == 0 && rr.os[k] % V == 0;
    if constexpr (sizeof(T) <= 4) {
      const int64_t groups = pairs / V;
      if (cos.dtype() == DType::f32 && sin.dtype() == DType::f32 && half % V == 0 && aligned &&
          groups < (int64_t{1} << 31)) {
        // The row dims (0: b, 1: h, 2: t) by x's stride, largest first (ties keep b, h, t order);
        // INGOT_ROPE_STORAGE_ORDER=0 keeps b, h, t (the earlier walk, for the A/B of bench/RESULTS.md).
        static const bool storage_order = [] {
          const char* v = std::getenv("INGOT_ROPE_STORAGE_ORDER");
          return !(v && std::strcmp(v, "0") == 0);
        }();
        int dims[3] = {0, 1, 2};
        if (storage_order)
          std::stable_sort(dims, dims + 3, [&](int p, int q) { return x.stride(p) > x.stride(q); });
        RopeOrder ro{};
        for (int k = 0; k < 3; ++k) {
          ro.n[k] = static_cast<uint32_t>(x.size(dims[k]));
          ro.xs[k] = x.stride(dims[k]);
          ro.os[k] = out.stride(dims[k]);
          if (dims[k] == 2) ro.t_at = k;
          if (dims[k] == 0) ro.b_at = k;
        }
        rope_vec_kernel<T, V><<<grid_for(groups, 256, L.device), 256, 0, L.stream>>>(
            out.data<T>(), x.data<T>(), y, cos.data<float>(), sin.data<float>(), ro, static_cast<uint32_t>(half),
            static_cast<uint32_t>(groups), static_cast<uint32_t>(T_len), per_row, inverse);
        CUDA_CHECK_LAUNCH();
        return;
      }
    }
    rope_kernel<T><<<grid_for(pairs, 256, L.device), 256, 0, L.stream>>>(out.data<T>(), x.data<T>(), y, cos.data_ptr(),
                                                                         sin.data_ptr(), cos.dtype(), rr, half, pairs,
                                                                         rows_per_batch, inverse);
    CUDA_CHECK_LAUNCH();
  });
}

void attention_fwd(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& positions, bool causal, double scale) {
  const char* op = "attention_fwd";
  AttnDims p = check_attention(op, q, k, v, lse, positions, causal, scale);
  check_like(op, out, q, "out");
  INGOT_CHECK(p.D <= kMaxHeadDim, op, ": head dim ", p.D, " > ", kMaxHeadDim, " is not supported");
  if (out.numel() == 0) return;
  LaunchContext L(q);
  if (p.S == 0) {  // no keys: every query sees nothing
    CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), L.stream));
    Tensor ninf = full(lse.shape(), -INFINITY, lse.dtype(), Device::cpu());
    CUDA_CHECK(cudaMemcpyAsync(lse.data_ptr(), ninf.data_ptr(), lse.nbytes(), cudaMemcpyHostToDevice, L.stream));
    CUDA_CHECK(cudaStreamSynchronize(L.stream));  // ninf is pageable host memory freed on return
    return;
  }
  const bool in_place = cudnn_attention::layout_reason({{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}}).empty();
  if (in_place && try_cudnn(op, q, k, lse, positions, causal,
                            [&] { cudnn_attention::forward(out, lse, q, k, v, causal, scale, L.stream); }))
    return;
  // Note [Attention layouts]: the fallback kernels (and cuDNN, for layouts it cannot take) run on contiguous
  // copies; the result is copied into out's layout.
  const Tensor qc = q.contiguous_raw(), kc = k.contiguous_raw(), vc = v.contiguous_raw();
  const Tensor oc = out.is_contiguous() ? out : empty(out.shape(), out.dtype(), out.device());
  if (!try_cudnn(op, qc, kc, lse, positions, causal,
                 [&] { cudnn_attention::forward(oc, lse, qc, kc, vc, causal, scale, L.stream); }))
    fallback_fwd(oc, lse, qc, kc, vc, p, L.stream);
  if (!out.is_contiguous()) Tensor(out).copy_(oc);
}

void attention_bwd(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& positions,
                   bool causal, double scale) {
  const char* op = "attention_bwd";
  AttnDims p = check_attention(op, q, k, v, lse, positions, causal, scale);
  check_like(op, dq, q, "dq");
  check_like(op, dout, q, "dout");
  check_like(op, out, q, "out");
  check_like(op, dk, k, "dk");
  check_like(op, dv, v, "dv");
  INGOT_CHECK(p.D <= kMaxHeadDim, op, ": head dim ", p.D, " > ", kMaxHeadDim, " is not supported");
  LaunchContext L(q);
  if (q.numel() == 0 || k.numel() == 0) {  // nothing attends: every gradient is zero
    for (const Tensor* g : {&dq, &dk, &dv})
      if (g->numel() > 0) CUDA_CHECK(cudaMemsetAsync(g->data_ptr(), 0, g->nbytes(), L.stream));
    return;
  }
  const bool in_place = cudnn_attention::layout_reason({{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out},
                                                        {"dout", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}})
                            .empty();
  if (in_place && try_cudnn(op, q, k, lse, positions, causal, [&] {
        cudnn_attention::backward(dq, dk, dv, dout, q, k, v, out, lse, causal, scale, L.stream);
      }))
    return;
  const Tensor qc = q.contiguous_raw(), kc = k.contiguous_raw(), vc = v.contiguous_raw();
  const Tensor oc = out.contiguous_raw(), doc = dout.contiguous_raw();
  auto dense = [](const Tensor& t) { return t.is_contiguous() ? t : empty(t.shape(), t.dtype(), t.device()); };
  const Tensor dqc = dense(dq), dkc = dense(dk), dvc = dense(dv);
  if (!try_cudnn(op, qc, kc, lse, positions, causal, [&] {
        cudnn_attention::backward(dqc, dkc, dvc, doc, qc, kc, vc, oc, lse, causal, scale, L.stream);
      }))
    fallback_bwd(dqc, dkc, dvc, doc, qc, kc, vc, oc, lse, p, L.stream);
  for (auto [dst, src] : {std::pair{dq, dqc}, {dk, dkc}, {dv, dvc}})
    if (!dst.is_contiguous()) dst.copy_(src);
}

}  // namespace ingot::kernels::cuda
