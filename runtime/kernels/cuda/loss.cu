// CUDA cross-entropy over logits [rows, V] with integer targets [rows] (i64 or i32), forward and backward.
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

}  // namespace

void cross_entropy_fwd(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                       int64_t ignore_index, double label_smoothing) {
  const char* op = "cross_entropy_fwd";
  auto [rows, C] = check_ce(op, logits, target, {{&loss, "loss"}, {&lse, "lse"}});
  if (rows == 0) return;
  LaunchContext L(logits);
  dispatch_float(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(target, op, [&](auto itag) {
      using I = decltype(itag);
      dispatch_vec<T>(vec_width<T>(C, {logits.data_ptr()}), [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        cross_entropy_fwd_kernel<T, I, V><<<rows, row_threads((C + V - 1) / V), 0, L.stream>>>(
            loss.data_ptr(), lse.data_ptr(), loss.dtype(), lse.dtype(), logits.data<T>(), target.data<I>(), C,
            ignore_index, label_smoothing);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void cross_entropy_bwd(const Tensor& dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& lse,
                       const Tensor& target, int64_t ignore_index, double label_smoothing) {
  const char* op = "cross_entropy_bwd";
  auto [rows, C] = check_ce(op, logits, target, {{&dloss, "dloss"}, {&lse, "lse"}});
  check_cuda_contig(dlogits, op, "dlogits");
  INGOT_CHECK(dlogits.shape() == logits.shape() && dlogits.dtype() == logits.dtype(), op,
              ": expected dlogits of logits' shape and dtype, got ", shape_str(dlogits.shape()), " ",
              dtype_name(dlogits.dtype()));
  if (rows == 0) return;
  LaunchContext L(logits);
  dispatch_float(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(target, op, [&](auto itag) {
      using I = decltype(itag);
      dispatch_vec<T>(vec_width<T>(C, {logits.data_ptr(), dlogits.data_ptr()}), [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        cross_entropy_bwd_kernel<T, I, V><<<rows, row_threads((C + V - 1) / V), 0, L.stream>>>(
            dlogits.data<T>(), dloss.data_ptr(), dloss.dtype(), logits.data<T>(), lse.data_ptr(), lse.dtype(),
            target.data<I>(), C, ignore_index, label_smoothing);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace ingot::kernels::cuda
