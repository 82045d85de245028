// CPU matrix product through OpenBLAS: out[i] = alpha * op(a[i]) @ op(b[i]) + beta * out[i].
//
// Approach: f32 and f64 call cblas_sgemm / cblas_dgemm directly on the caller's buffers, one call per batch
// entry (a batch of 1 on either side is broadcast by giving it a zero batch step). bf16 and f16 have no BLAS
// routine, so both operands (and `out` when beta != 0) are widened into f32 scratch, multiplied with sgemm and
// rounded back once at the end. The batch loop is serial: OpenBLAS threads each gemm itself, and calling the
// pthreads build from several OpenMP threads at once would only oversubscribe the cores.
//
// Shapes (all contiguous): a [batch_a, M, K] ([batch_a, K, M] when trans_a), b [batch_b, K, N]
// ([batch_b, N, K] when trans_b), out [batch, M, N], batch_a and batch_b each `batch` or 1.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "runtime/kernels/cpu/loops.h"
#include "runtime/kernels/kernels.h"

namespace ingot::kernels::cpu {
namespace {

struct GemmShape {
  int64_t batch, batch_a, batch_b, m, n, k;
  bool trans_a, trans_b;
};

void gemm(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c) {
  cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(s.m), static_cast<blasint>(s.n), static_cast<blasint>(s.k), alpha, a,
              static_cast<blasint>(std::max<int64_t>(1, s.trans_a ? s.m : s.k)), b,
              static_cast<blasint>(std::max<int64_t>(1, s.trans_b ? s.k : s.n)), beta, c,
              static_cast<blasint>(std::max<int64_t>(1, s.n)));
}

void gemm(const GemmShape& s, double alpha, const double* a, const double* b, double beta, double* c) {
  cblas_dgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(s.m), static_cast<blasint>(s.n), static_cast<blasint>(s.k), alpha, a,
              static_cast<blasint>(std::max<int64_t>(1, s.trans_a ? s.m : s.k)), b,
              static_cast<blasint>(std::max<int64_t>(1, s.trans_b ? s.k : s.n)), beta, c,
              static_cast<blasint>(std::max<int64_t>(1, s.n)));
}

template <typename T>
void gemm_batches(const GemmShape& s, double alpha, const T* a, const T* b, double beta, T* c) {
  const int64_t step_a = s.batch_a == 1 ? 0 : s.m * s.k;
  const int64_t step_b = s.batch_b == 1 ? 0 : s.k * s.n;
  for (int64_t i = 0; i < s.batch; ++i)
    gemm(s, static_cast<T>(alpha), a + i * step_a, b + i * step_b, static_cast<T>(beta), c + i * s.m * s.n);
}

}  // namespace

void matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha,
            double beta) {
  INGOT_INTERNAL_CHECK(out.dim() == 3 && a.dim() == 3 && b.dim() == 3, "matmul kernel: expected 3-D operands, got ",
                       shape_str(a.shape()), " @ ", shape_str(b.shape()), " -> ", shape_str(out.shape()));
  // Besides one dtype throughout: f32 out of bf16 / f16 operands (the product is not rounded to them first).
  const bool widened = out.dtype() == DType::f32 && (a.dtype() == DType::bf16 || a.dtype() == DType::f16);
  INGOT_INTERNAL_CHECK((a.dtype() == out.dtype() || widened) && b.dtype() == a.dtype() && is_floating(out.dtype()),
                       "matmul kernel: dtypes ", dtype_name(a.dtype()), ", ", dtype_name(b.dtype()), " -> ",
                       dtype_name(out.dtype()));
  GemmShape s{out.size(0), a.size(0), b.size(0), out.size(1), out.size(2), trans_a ? a.size(1) : a.size(2),
              trans_a, trans_b};
  INGOT_INTERNAL_CHECK((trans_a ? a.size(2) : a.size(1)) == s.m && (trans_b ? b.size(2) : b.size(1)) == s.k &&
                           (trans_b ? b.size(1) : b.size(2)) == s.n &&
                           (s.batch_a == s.batch || s.batch_a == 1) && (s.batch_b == s.batch || s.batch_b == 1),
                       "matmul kernel: shapes ", shape_str(a.shape()), (trans_a ? "^T" : ""), " @ ",
                       shape_str(b.shape()), (trans_b ? "^T" : ""), " -> ", shape_str(out.shape()));
  INGOT_CHECK(s.m <= INT_MAX && s.n <= INT_MAX && s.k <= INT_MAX, "matmul: matrix dims M=", s.m, ", N=", s.n,
              ", K=", s.k, " exceed the BLAS limit of ", INT_MAX);
  if (out.numel() == 0) return;
  if (s.k == 0) {  // an empty sum: BLAS would reject the zero leading dimension of a
    if (beta == 0.0) fill(out, 0.0);
    else unary(UnaryOp::MulScalar, out, out, beta);
    return;
  }
  INGOT_INTERNAL_CHECK(out.is_contiguous() && a.is_contiguous() && b.is_contiguous(),
                       "matmul kernel: operands must be contiguous");
  switch (a.dtype()) {
    case DType::f32:
      gemm_batches(s, alpha, a.data<float>(), b.data<float>(), beta, out.data<float>());
      break;
    case DType::f64:
      gemm_batches(s, alpha, a.data<double>(), b.data<double>(), beta, out.data<double>());
      break;
    default: {  // bf16 / f16: widen, multiply in f32, round once
      std::vector<float> fa = load_all<float>(a), fb = load_all<float>(b);
      std::vector<float> fc = beta == 0.0 ? std::vector<float>(static_cast<size_t>(out.numel())) : load_all<float>(out);
      gemm_batches(s, alpha, fa.data(), fb.data(), beta, fc.data());
      store_strided<float>(out.dtype(), out.data_ptr(), 1, out.numel(), fc.data());
    }
  }
}

void matmul_bias(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, const Tensor& bias) {
  INGOT_INTERNAL_CHECK(bias.dim() == 1 && bias.size(0) == out.size(2) && bias.dtype() == out.dtype(),
                       "matmul_bias kernel: bias ", shape_str(bias.shape()), " ", dtype_name(bias.dtype()), " for out ",
                       shape_str(out.shape()), " ", dtype_name(out.dtype()));
  copy(out, bias.expand_raw(out.shape()));
  matmul(out, a, b, trans_a, trans_b, 1.0, 1.0);
}

void matmul_bias_gelu(const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b, bool trans_a,
                      bool trans_b, const Tensor& bias) {
  INGOT_INTERNAL_CHECK(out.dim() == 3 && pre.shape() == out.shape() && pre.dtype() == out.dtype(),
                       "matmul_bias_gelu kernel: out ", shape_str(out.shape()), ", pre ", shape_str(pre.shape()));
  matmul_bias(pre, a, b, trans_a, trans_b, bias);
  unary(UnaryOp::GeluTanh, out, pre, 0.0);
}

void matmul_dgelu(const Tensor& out, const Tensor& dbias, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                  const Tensor& pre) {
  const int64_t m = out.size(1), n = out.size(2);
  INGOT_INTERNAL_CHECK(out.dim() == 3 && out.size(0) == 1 && pre.numel() == m * n && pre.is_contiguous() &&
                           pre.dtype() == out.dtype() && (!dbias.defined() || dbias.numel() == n),
                       "matmul_dgelu kernel: out ", shape_str(out.shape()), ", pre ", shape_str(pre.shape()));
  // The product in f32 (exact widening of bf16 / f16 operands), then the eager GELU-gradient kernel on it in
  // place, rounded once into out; the bias gradient sums the f32 values.
  Tensor af = empty(a.shape(), DType::f32), bf = empty(b.shape(), DType::f32), prod = empty(out.shape(), DType::f32);
  copy(af, a);
  copy(bf, b);
  matmul(prod, af, bf, trans_a, trans_b, 1.0, 0.0);
  binary(BinaryOp::GeluTanhGrad, prod, pre.as_strided(prod.shape(), prod.strides(), pre.offset()), prod);
  copy(out, prod);
  if (dbias.defined()) {
    Tensor col = empty({n}, DType::f32);
    reduce(ReduceOp::Sum, col, prod, 1, m, n);
    copy(dbias, col);
  }
}

}  // namespace ingot::kernels::cpu
