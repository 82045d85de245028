// Device helpers of the row-wise, loss, indexing, attention and dense elementwise CUDA kernels (norm.cu, loss.cu,
// index.cu, attention.cu, elementwise.cu), on top of common.cuh (dtype dispatch, acc_t, to_acc/from_acc,
// load_dyn/store_dyn, LaunchContext): 16-byte vectorized row loads and stores, multi-value block sums, the online
// (max, sum of exp) reduction, and host-side row launch shapes.
//
// Small per-row statistics (mean, rstd, lse, loss) and per-column parameter gradients go through
// load_dyn / store_dyn, so callers may hand f32 or f64 tensors for them.
#pragma once

#include <cstdint>
#include <type_traits>

#include "runtime/kernels/cuda/common.cuh"

namespace ingot::kernels::cuda::rowwise {

// Accurate math in the compute type (expf/logf, not the fast intrinsics: these kernels are memory-bound and
// their results are compared with the CPU kernels at ~1e-5).
__device__ __forceinline__ float dexp(float x) { return expf(x); }
__device__ __forceinline__ double dexp(double x) { return exp(x); }
__device__ __forceinline__ float dlog(float x) { return logf(x); }
__device__ __forceinline__ double dlog(double x) { return log(x); }
__device__ __forceinline__ float drsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ double drsqrt(double x) { return rsqrt(x); }
template <typename A>
__device__ __forceinline__ A neg_inf() { return -static_cast<A>(INFINITY); }

// N consecutive elements moved as one access (16 bytes when N * sizeof(T) == 16).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
template <int N, typename T, typename A>
__device__ __forceinline__ void load_vec(const T* p, A (&out)[N]) {
  Pack<T, N> pk = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = to_acc<A>(pk.v[k]);
}
template <int N, typename T, typename A>
__device__ __forceinline__ void store_vec(T* p, const A (&in)[N]) {
  Pack<T, N> pk;
#pragma unroll
  for (int k = 0; k < N; ++k) pk.v[k] = from_acc<T>(in[k]);
  *reinterpret_cast<Pack<T, N>*>(p) = pk;
}

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sums N values over the whole block; every thread gets the totals. `smem` holds 32 * N values. Starts with
// a barrier so that back-to-back calls may reuse `smem`.
template <int N, typename A>
__device__ __forceinline__ void block_sum(A (&v)[N], A* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = warp_sum(v[k]);
  __syncthreads();
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < N; ++k) smem[k * 32 + warp] = v[k];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = warp_sum(lane < nwarps ? smem[k * 32 + lane] : A(0));
}

// Merges a running (max m, sum of exp(x - m)) pair with another; a -inf max means "no finite element yet".
template <typename A>
__device__ __forceinline__ void lse_merge(A& m, A& s, A m2, A s2) {
  A mx = fmax(m, m2);
  if (mx == neg_inf<A>()) return;
  s = (m == neg_inf<A>() ? A(0) : s * dexp(m - mx)) + (m2 == neg_inf<A>() ? A(0) : s2 * dexp(m2 - mx));
  m = mx;
}
// Folds one element into a running (m, s) pair; NaN propagates into s.
template <typename A>
__device__ __forceinline__ void lse_push(A& m, A& s, A x) {
  if (x > m) {
    s = s * dexp(m - x) + A(1);  // exp(-inf) == 0 when m is still -inf
    m = x;
  } else if (x != neg_inf<A>()) {
    s += dexp(x - m);
  }
}
// Block-wide (max, sum exp) over every thread's pair; every thread gets the result. smem holds 64 values.
template <typename A>
__device__ __forceinline__ void block_lse(A& m, A& s, A* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) {
    smem[warp] = m;
    smem[32 + warp] = s;
  }
  __syncthreads();
  m = lane < nwarps ? smem[lane] : neg_inf<A>();
  s = lane < nwarps ? smem[32 + lane] : A(0);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

// ---- host side ----------------------------------------------------------------------------------------------

// 16 bytes / sizeof(T) when every row of `cols` elements of every pointer starts 16-byte aligned, else 1.
template <typename T>
int vec_width(int64_t cols, std::initializer_list<const void*> ptrs) {
  constexpr int n = 16 / sizeof(T);
  if (cols % n != 0) return 1;
  for (const void* p : ptrs)
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
  return n;
}

// Calls f(std::integral_constant<int, V>{}) for V == vec (one of 1 and 16 / sizeof(T)).
template <typename T, typename F>
void dispatch_vec(int vec, F&& f) {
  constexpr int n = 16 / sizeof(T);
  if (vec == n) f(std::integral_constant<int, n>{});
  else f(std::integral_constant<int, 1>{});
}

// Threads for a block that owns one row of `packs` vector packs: a power of two in [32, max_threads].
inline int row_threads(int64_t packs, int max_threads = 512) {
  int t = 32;
  while (t < max_threads && t < packs) t <<= 1;
  return t;
}

inline const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
inline void* mut_ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
inline DType dtype_or_f32(const Tensor& t) { return t.defined() ? t.dtype() : DType::f32; }

// Throws naming `op` unless `t` is a contiguous CUDA tensor.
inline void check_cuda_contig(const Tensor& t, const char* op, const char* name) {
  INGOT_CHECK(t.device().is_cuda(), op, ": expected ", name, " on a CUDA device, got ", t.device().str());
  INGOT_CHECK(t.is_contiguous(), op, ": expected ", name, " contiguous, got shape ", shape_str(t.shape()),
              " with non-contiguous strides");
}

}  // namespace ingot::kernels::cuda::rowwise
