// CUDA cross-entropy over logits [rows, V] with integer targets [rows] (i64 or i32): forward, backward, and both
// fused.
//
//   lse[r]  = log(sum_j exp(x[r, j]))
//   loss[r] = (1 - ls) * (lse[r] - x[r, t]) + ls * (lse[r] - mean_j x[r, j])   (0 where t == ignore_index)
//   dx[r, j] = dloss[r] * (exp(x[r, j] - lse[r]) - (1 - ls) * [j == t] - ls / V)  (0 where t == ignore_index)
//
// Approach: one block per row. The forward reads the row once, keeping an online (max, sum of exp) pair and, with
// label smoothing, the plain sum; the backward is one read and one write of the row. 16-byte packs when the rows
// are aligned. lse is written for every row (ignored rows too: it is well defined). A target outside [0, V)
// that is not ignore_index cannot be reported from the device without a synchronization, so its row's loss is
// NaN, which surfaces in the reduced loss; the op layer validates targets it can see on the host.
//
// The fused kernel (the approach of llm.c's fused classifier) computes loss, lse and dlogits in one block per row
// and two passes over it: the reduction, then the gradient. The second pass is meant to hit L2: with 1024
// threads a block, at most two rows per SM are in flight (264 rows, 26 MB of bf16 GPT-2 logits on an H100's
// 50 MB L2), and the first pass walks the row from its end, so the second pass starts on the lines read last.
// The second pass loads and stores with the evict-first hint: those lines are not read again. dlogits may be
// the logits' own buffer: every thread finishes its first-pass reads before the block reductions' barriers,
// and in the second pass each thread writes only the pack it has just read.
// Measured on an H100 (16384 x 50304 bf16 logits, dlogits in place, mean of 20 launches after 3 warm-ups, the
// kernels launched from a standalone harness): 1.24 ms, against 0.96 + 1.06 ms for cross_entropy_fwd_kernel then
// cross_entropy_bwd_kernel. With the separate kernels' accurate expf it took 1.61 ms: at 8 bf16 logits a 16-byte
// load the exponentials, not HBM, bounded it, hence exp2_fast. Keeping the row in shared memory between the
// passes instead of rereading it from L2 measured the same (1.24 ms); 512 threads a block, 1.32 ms. On sm_90 a
// persistent version that brings each row into shared memory with one bulk copy while the previous row computes
// is faster (Note [Cross-entropy rows staged in shared memory]).
#include <cstdlib>
#include <string>

#include "runtime/kernels/cuda/row_common.cuh"
#include "runtime/kernels/kernels.h"

namespace ingot::kernels::cuda {
namespace {

using namespace rowwise;

// kernels -----------------------------------------------------------------------------------------------------

template <typename T, typename I, int V>
__global__ void cross_entropy_fwd_kernel(void* loss, void* lse, DType loss_dt, DType lse_dt, const T* logits,
                                         const I* target, int64_t C, int64_t ignore_index, double ls) {
  using A = acc_t<T>;
  __shared__ A smem[64];
  const int64_t row = blockIdx.x;
  const T* xr = logits + row * C;
  A m = neg_inf<A>(), s = 0, sum[1] = {0};
  for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
    A v[V];
    load_vec<V>(xr + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      lse_push(m, s, v[k]);
      sum[0] += v[k];
    }
  }
  block_lse(m, s, smem);
  if (ls != 0.0) block_sum(sum, smem);
  if (threadIdx.x != 0) return;
  const A row_lse = m + dlog(s);
  store_dyn(lse, lse_dt, row, row_lse);
  const int64_t t = static_cast<int64_t>(target[row]);
  A l;
  if (t == ignore_index) {
    l = 0;
  } else if (t < 0 || t >= C) {
    l = static_cast<A>(NAN);
  } else {
    const A a = static_cast<A>(ls);
    l = (A(1) - a) * (row_lse - to_acc<A>(xr[t]));
    if (ls != 0.0) l += a * (row_lse - sum[0] / static_cast<A>(C));
  }
  store_dyn(loss, loss_dt, row, l);
}

template <typename T, typename I, int V>
__global__ void cross_entropy_bwd_kernel(T* dlogits, const void* dloss, DType dloss_dt, const T* logits,
                                         const void* lse, DType lse_dt, const I* target, int64_t C,
                                         int64_t ignore_index, double ls) {
  using A = acc_t<T>;
  const int64_t row = blockIdx.x;
  const int64_t t = static_cast<int64_t>(target[row]);
  T* dr = dlogits + row * C;
  if (t == ignore_index) {
    A z[V];
#pragma unroll
    for (int k = 0; k < V; ++k) z[k] = 0;
    for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) store_vec<V>(dr + i, z);
    return;
  }
  const T* xr = logits + row * C;
  const A g = load_dyn<A>(dloss, dloss_dt, row), row_lse = load_dyn<A>(lse, lse_dt, row);
  const A hit = A(1) - static_cast<A>(ls), smooth = static_cast<A>(ls) / static_cast<A>(C);
  for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
    A v[V];
    load_vec<V>(xr + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = g * (dexp(v[k] - row_lse) - (i + k == t ? hit : A(0)) - smooth);
    store_vec<V>(dr + i, v);
  }
}

// Evict-first 16-byte accesses (other widths are plain): for data the kernel touches in global memory once.
template <int N, typename T>
__device__ __forceinline__ Pack<T, N> load_pack_once(const T* p) {
  Pack<T, N> pk;
  if constexpr (sizeof(pk) == 16) {
    const int4 raw = __ldcs(reinterpret_cast<const int4*>(p));
    memcpy(&pk, &raw, sizeof raw);
  } else {
    pk = *reinterpret_cast<const Pack<T, N>*>(p);
  }
  return pk;
}
template <int N, typename T, typename A>
__device__ __forceinline__ void store_vec_once(T* p, const A (&in)[N]) {
  Pack<T, N> pk;
#pragma unroll
  for (int k = 0; k < N; ++k) pk.v[k] = from_acc<T>(in[k]);
  if constexpr (sizeof(pk) == 16) {
    int4 raw;
    memcpy(&raw, &pk, sizeof raw);
    __stcs(reinterpret_cast<int4*>(p), raw);
  } else {
    *reinterpret_cast<Pack<T, N>*>(p) = pk;
  }
}
template <int N, typename T, typename A>
__device__ __forceinline__ void unpack(const Pack<T, N>& pk, A (&out)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = to_acc<A>(pk.v[k]);
}

constexpr int kFusedMaxThreads = 1024;

// Threads per row of the fused kernel (16384 x 50304 bf16, in place, medians of 20): on an H200, 512 threads
// (four rows per SM) 1.035 ms against 1.127 ms with 1024 (256: 1.14 ms; unrolling either pass changed nothing);
// on an H100, 1024 threads 1.315 ms against 1.372 ms with 512. The GPU with more DRAM bandwidth per SM wants more
// rows, each between its two passes at a different moment, so the split is by bandwidth per SM (H100 ~25 GB/s,
// H200 ~37 GB/s).
int fused_threads(int device) { return dram_gbps_per_sm(device) > 30.0 ? 512 : kFusedMaxThreads; }

// Note [Cross-entropy rows staged in shared memory]: a row buffer's size, rounded up to 128 bytes (the bulk
// copies' destinations stay aligned); the launcher sizes the shared memory and the kernel places buffer 1 with it.
__host__ __device__ constexpr int64_t staged_row_stride(int64_t row_bytes) { return (row_bytes + 127) / 128 * 128; }

// Note [Cross-entropy rows staged in shared memory]: the dynamic shared memory for two rows of `row_bytes` on
// `device`, or 0 when that kernel does not apply (before sm_90 or INGOT_HOPPER=0: Note [Hopper-only paths]; rows
// too long for two buffers; INGOT_CE_STAGED=0 for comparisons). Rows must also be 16-byte multiples: the caller's 16-byte packs ensure it.
size_t staged_smem_bytes(int device, int64_t row_bytes) {
  static const bool off = [] {
    const char* v = std::getenv("INGOT_CE_STAGED");
    return v != nullptr && std::string(v) == "0";
  }();
  if (off || row_bytes % 16 != 0) return 0;
  const int optin = hopper_paths(device) ? shared_bytes_optin(device) : 0;
  const int64_t need = 2 * staged_row_stride(row_bytes);
  // The kernel's static shared memory (barriers, reduction scratch) takes the last 1 KB.
  return need + 1024 <= optin ? static_cast<size_t>(need) : 0;
}

// exp(x) as 2^(x * log2(e)) = 2^fma(x, log2e, -m * log2e) with the SFU's 2^x (about 2 ulps), where the
// separate kernels call the accurate expf: the fused kernel takes two exponentials of every logit.
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ double exp2_fast(double x) { return exp2(x); }
template <typename A>
constexpr A kLog2e = static_cast<A>(1.4426950408889634);

// The fused kernels' row math, shared by cross_entropy_fused_kernel and its staged version.
// Folds one pack into a thread's online (max m, sum of exp s) pair and plain sum: s is rescaled only when the pack
// raises the max. While m is -inf every element is -inf (adds 0) or NaN (propagates).
template <int V, bool Smooth = true, typename A>
__device__ __forceinline__ void lse_push_pack(const A (&v)[V], A& m, A& s, A& sum) {
  A pm = v[0];
#pragma unroll
  for (int k = 1; k < V; ++k) pm = fmax(pm, v[k]);
  if (pm > m) {
    s *= exp2_fast((m - pm) * kLog2e<A>);
    m = pm;
  }
  const A ml = m == neg_inf<A>() ? A(0) : m * kLog2e<A>;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    s += exp2_fast(fma(v[k], kLog2e<A>, -ml));
    if constexpr (Smooth) sum += v[k];  // the plain sum only label smoothing reads
  }
}
// The row's loss from its lse, target logit xt and plain sum (0 for an ignored row, NaN for a target out of range).
template <typename A>
__device__ __forceinline__ A row_loss(A row_lse, A xt, A sum, bool counted, bool in_range, double ls, int64_t C) {
  if (!counted) return 0;
  if (!in_range) return static_cast<A>(NAN);
  const A a = static_cast<A>(ls);
  A l = (A(1) - a) * (row_lse - xt);
  if (ls != 0.0) l += a * (row_lse - sum / static_cast<A>(C));
  return l;
}
// After a row's first pass: combines the block's (m, s) pairs and sums, writes lse and loss (thread 0) and returns
// the row's lse to every thread. xt() gives thread 0 the target's logit. (The staged kernel reads it from shared
// memory here; reading it before its first pass made that kernel 8% slower on an H200.)
template <typename A, typename Xt>
__device__ __forceinline__ A finish_row(A m, A s, A (&sum)[1], Xt xt, A* smem, void* loss, void* lse, DType loss_dt,
                                        DType lse_dt, int64_t row, bool counted, bool in_range, double ls, int64_t C) {
  block_lse(m, s, smem);
  if (ls != 0.0) block_sum(sum, smem);
  const A row_lse = m + dlog(s);
  if (threadIdx.x == 0) {
    store_dyn(lse, lse_dt, row, row_lse);
    store_dyn(loss, loss_dt, row, row_loss(row_lse, xt(), sum[0], counted, in_range, ls, C));
  }
  return row_lse;
}
// The gradient of pack v (elements from column `first`): g * (softmax - smoothing - hit at the target), in place.
template <int V, bool Smooth = true, typename A>
__device__ __forceinline__ void grad_pack(A (&v)[V], int64_t first, int64_t t, A lse_l, A g, A hit, A smooth) {
#pragma unroll
  for (int k = 0; k < V; ++k) {
    v[k] = exp2_fast(fma(v[k], kLog2e<A>, -lse_l));
    if constexpr (Smooth) v[k] -= smooth;
  }
  // One pack holds the target: a per-pack test instead of a 64-bit compare per element.
  if (const int64_t at = t - first; at >= 0 && at < V)
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (k == at) v[k] -= hit;
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] *= g;
}

// logits, dlogits [rows, C] (possibly one buffer, so neither is __restrict__); loss, lse, dloss [rows].
template <typename T, typename I, int V>
__global__ void __launch_bounds__(kFusedMaxThreads)
    cross_entropy_fused_kernel(void* loss, void* lse, DType loss_dt, DType lse_dt, T* dlogits, const T* logits,
                               const I* target, const void* dloss, DType dloss_dt, int64_t C, int64_t ignore_index,
                               double ls) {
  using A = acc_t<T>;
  __shared__ A smem[64];
  const int64_t row = blockIdx.x;
  const T* xr = logits + row * C;
  T* dr = dlogits + row * C;
  const int64_t t = static_cast<int64_t>(target[row]);
  const bool counted = t != ignore_index, in_range = t >= 0 && t < C;
  // Read before the barriers below, after which other threads may overwrite it.
  A xt = 0;
  if (threadIdx.x == 0 && counted && in_range) xt = to_acc<A>(xr[t]);
  A m = neg_inf<A>(), s = 0, sum[1] = {0};
  const int64_t packs = C / V;  // V divides C whenever V > 1 (vec_width)
  for (int64_t p = packs - 1 - threadIdx.x; p >= 0; p -= blockDim.x) {
    A v[V];
    load_vec<V>(xr + p * V, v);
    lse_push_pack<V>(v, m, s, sum[0]);
  }
  const A row_lse = finish_row(
      m, s, sum, [&] { return xt; }, smem, loss, lse, loss_dt, lse_dt, row, counted, in_range, ls, C);
  if (!counted) {
    A z[V];
#pragma unroll
    for (int k = 0; k < V; ++k) z[k] = 0;
    for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) store_vec_once<V>(dr + i, z);
    return;
  }
  const A g = load_dyn<A>(dloss, dloss_dt, row), lse_l = row_lse * kLog2e<A>;
  const A hit = A(1) - static_cast<A>(ls), smooth = static_cast<A>(ls) / static_cast<A>(C);
  for (int64_t i = threadIdx.x * V; i < C; i += blockDim.x * V) {
    A v[V];
    unpack(load_pack_once<V>(xr + i), v);
    grad_pack<V>(v, i, t, lse_l, g, hit, smooth);
    store_vec_once<V>(dr + i, v);
  }
}

// Note [Cross-entropy rows staged in shared memory]: on sm_90, 16-bit logits whose rows fit twice in shared
// memory take a persistent version of the fused kernel: one block of kStagedThreads per SM walks rows
// blockIdx.x, +gridDim.x, ..., and while it computes one row, a bulk copy (cp.async.bulk, completing on an
// mbarrier) brings the next into the other buffer. The row is read from HBM once and never from L2 again, and
// the copies keep a whole row per SM in flight (the per-thread loads of the kernel above left its warps waiting
// on L1TEX half of their cycles; ncu, H200). Same arithmetic as cross_entropy_fused_kernel. dlogits may be the
// logits' buffer: a row is written only after its copy completed, and the copy in flight reads another row.
constexpr int kStagedThreads = 1024;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Smooth: label smoothing is on. Without it the plain sums and the smoothing offsets are compiled out: the loops
// issue an instruction most cycles, and the two fewer per element took the kernel from 0.955 to 0.933 ms (H200).
template <typename T, typename I, bool Smooth>
__global__ void __launch_bounds__(kStagedThreads, 1)
    cross_entropy_fused_staged_kernel(void* loss, void* lse, DType loss_dt, DType lse_dt, T* dlogits, const T* logits,
                                      const I* target, const void* dloss, DType dloss_dt, int64_t rows, int C,
                                      int64_t ignore_index, double ls) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int V = 16 / sizeof(T);
  using A = float;
  extern __shared__ __align__(128) unsigned char staged[];
  __shared__ __align__(8) uint64_t full[2];
  __shared__ A smem[64];
  const uint32_t row_bytes = static_cast<uint32_t>(C) * sizeof(T),
                 stride = static_cast<uint32_t>(staged_row_stride(row_bytes));
  // Thread 0 asks for row r in buffer b: the copy counts its bytes on full[b].
  auto fetch = [&](int64_t r, int b) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&full[b])), "r"(row_bytes)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(staged + b * stride)),
                 "l"(logits + r * C), "r"(row_bytes), "r"(smem_addr(&full[b]))
                 : "memory");
  };
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&full[b])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    if (blockIdx.x < rows) fetch(blockIdx.x, 0);
  }
  __syncthreads();
  const int packs = C / V;
  int k = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x, ++k) {
    const int b = k & 1;
    // The other buffer was last read in the previous row, which every thread finished (the barrier below).
    if (threadIdx.x == 0 && row + gridDim.x < rows) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      fetch(row + gridDim.x, b ^ 1);
    }
    {
      const uint32_t bar = smem_addr(&full[b]), parity = (k >> 1) & 1;
      uint32_t done = 0;
      while (!done)
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
    const T* xr = reinterpret_cast<const T*>(staged + b * stride);
    T* dr = dlogits + row * C;
    const int64_t t = static_cast<int64_t>(target[row]);
    const bool counted = t != ignore_index, in_range = t >= 0 && t < C;
    A m = neg_inf<A>(), s = 0, sum[1] = {0};
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      A v[V];
      load_vec<V>(xr + p * V, v);
      lse_push_pack<V, Smooth>(v, m, s, sum[0]);
    }
    auto xt = [&] { return counted && in_range ? to_acc<A>(xr[t]) : A(0); };
    const A row_lse = finish_row(m, s, sum, xt, smem, loss, lse, loss_dt, lse_dt, row, counted, in_range, ls, C);
    const A g = counted ? load_dyn<A>(dloss, dloss_dt, row) : A(0), lse_l = row_lse * kLog2e<A>;
    const A hit = A(1) - static_cast<A>(ls), smooth = static_cast<A>(ls) / static_cast<A>(C);
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      A v[V];
      load_vec<V>(xr + p * V, v);
      if (counted) {
        grad_pack<V, Smooth>(v, static_cast<int64_t>(p) * V, t, lse_l, g, hit, smooth);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = 0;
      }
      store_vec_once<V>(dr + static_cast<int64_t>(p) * V, v);
    }
    __syncthreads();  // every thread is done with buffer b (and smem) before it is refilled
  }
#endif
}

// launchers ---------------------------------------------------------------------------------------------------

// Calls f(I{}) with I the element type of an integer target tensor.
template <typename F>
void dispatch_index(const Tensor& target, const char* op, F&& f) {
  if (target.dtype() == DType::i64) return f(int64_t{});
  if (target.dtype() == DType::i32) return f(int32_t{});
  INGOT_FAIL(op, ": expected target i64 or i32, got ", dtype_name(target.dtype()));
}

// Checks logits [rows, C] against target [rows] and a per-row f32/f64 vector; returns (rows, C).
std::pair<int64_t, int64_t> check_ce(const char* op, const Tensor& logits, const Tensor& target,
                                     std::initializer_list<std::pair<const Tensor*, const char*>> per_row) {
  check_cuda_contig(logits, op, "logits");
  check_cuda_contig(target, op, "target");
  const int64_t C = logits.dim() == 0 ? 1 : logits.size(-1), rows = C == 0 ? 0 : logits.numel() / C;
  INGOT_CHECK(target.numel() == rows, op, ": expected target of ", rows, " elements for logits ",
              shape_str(logits.shape()), ", got ", shape_str(target.shape()));
  for (auto [t, name] : per_row) {
    check_cuda_contig(*t, op, name);
    INGOT_CHECK(t->numel() == rows && (t->dtype() == DType::f32 || t->dtype() == DType::f64), op, ": expected ",
                name, " f32 [", rows, "], got ", shape_str(t->shape()), " ", dtype_name(t->dtype()));
  }
  return {rows, C};
}

void check_dlogits(const char* op, const Tensor& dlogits, const Tensor& logits) {
  check_cuda_contig(dlogits, op, "dlogits");
  INGOT_CHECK(dlogits.shape() == logits.shape() && dlogits.dtype() == logits.dtype(), op,
              ": expected dlogits of logits' shape and dtype, got ", shape_str(dlogits.shape()), " ",
              dtype_name(dlogits.dtype()));
}

// Runs fn(T{}, I{}, std::integral_constant<int, V>{}) for the logits' float type T, the target's index type I and
// the widest vector width V the row length and `ptrs` allow.
template <typename F>
void dispatch_ce(const char* op, const Tensor& logits, const Tensor& target, int64_t C,
                 std::initializer_list<const void*> ptrs, F fn) {
  dispatch_float(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(target, op, [&](auto itag) {
      dispatch_vec<T>(vec_width<T>(C, ptrs), [&](auto vec) { fn(tag, itag, vec); });
    });
  });
}

}  // namespace

void cross_entropy_fwd(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                       int64_t ignore_index, double label_smoothing) {
  const char* op = "cross_entropy_fwd";
  auto [rows, C] = check_ce(op, logits, target, {{&loss, "loss"}, {&lse, "lse"}});
  if (rows == 0) return;
  LaunchContext L(logits);
  dispatch_ce(op, logits, target, C, {logits.data_ptr()}, [&](auto tag, auto itag, auto vec) {
    using T = decltype(tag);
    using I = decltype(itag);
    constexpr int V = decltype(vec)::value;
    cross_entropy_fwd_kernel<T, I, V><<<rows, row_threads((C + V - 1) / V), 0, L.stream>>>(
        loss.data_ptr(), lse.data_ptr(), loss.dtype(), lse.dtype(), logits.data<T>(), target.data<I>(), C,
        ignore_index, label_smoothing);
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_bwd(const Tensor& dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& lse,
                       const Tensor& target, int64_t ignore_index, double label_smoothing) {
  const char* op = "cross_entropy_bwd";
  auto [rows, C] = check_ce(op, logits, target, {{&dloss, "dloss"}, {&lse, "lse"}});
  check_dlogits(op, dlogits, logits);
  if (rows == 0) return;
  LaunchContext L(logits);
  dispatch_ce(op, logits, target, C, {logits.data_ptr(), dlogits.data_ptr()}, [&](auto tag, auto itag, auto vec) {
    using T = decltype(tag);
    using I = decltype(itag);
    constexpr int V = decltype(vec)::value;
    cross_entropy_bwd_kernel<T, I, V><<<rows, row_threads((C + V - 1) / V), 0, L.stream>>>(
        dlogits.data<T>(), dloss.data_ptr(), dloss.dtype(), logits.data<T>(), lse.data_ptr(), lse.dtype(),
        target.data<I>(), C, ignore_index, label_smoothing);
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_fused(const Tensor& loss, const Tensor& lse, const Tensor& dlogits, const Tensor& logits,
                         const Tensor& target, const Tensor& dloss, int64_t ignore_index, double label_smoothing) {
  const char* op = "cross_entropy_fused";
  auto [rows, C] = check_ce(op, logits, target, {{&loss, "loss"}, {&lse, "lse"}, {&dloss, "dloss"}});
  check_dlogits(op, dlogits, logits);
  if (rows == 0) return;
  LaunchContext L(logits);
  dispatch_ce(op, logits, target, C, {logits.data_ptr(), dlogits.data_ptr()}, [&](auto tag, auto itag, auto vec) {
    using T = decltype(tag);
    using I = decltype(itag);
    constexpr int V = decltype(vec)::value;
    if constexpr (sizeof(T) == 2 && V == 8) {
      if (const size_t smem = staged_smem_bytes(L.device, C * static_cast<int64_t>(sizeof(T)))) {
        auto kernel = label_smoothing != 0.0 ? cross_entropy_fused_staged_kernel<T, I, true>
                                             : cross_entropy_fused_staged_kernel<T, I, false>;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        // Persistent: one CTA per usable SM (Note [SM carve-out]).
        const int64_t grid = std::min<int64_t>(rows, usable_sms(L.device));
        kernel<<<static_cast<unsigned>(grid), kStagedThreads, smem, L.stream>>>(
            loss.data_ptr(), lse.data_ptr(), loss.dtype(), lse.dtype(), dlogits.data<T>(), logits.data<T>(),
            target.data<I>(), dloss.data_ptr(), dloss.dtype(), rows, static_cast<int>(C), ignore_index,
            label_smoothing);
        CUDA_CHECK_LAUNCH();
        return;
      }
    }
    const int threads = row_threads((C + V - 1) / V, fused_threads(L.device));
    cross_entropy_fused_kernel<T, I, V><<<rows, threads, 0, L.stream>>>(
        loss.data_ptr(), lse.data_ptr(), loss.dtype(), lse.dtype(), dlogits.data<T>(), logits.data<T>(),
        target.data<I>(), dloss.data_ptr(), dloss.dtype(), C, ignore_index, label_smoothing);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ingot::kernels::cuda
