// CPU elementwise kernels: fill, copy (with dtype conversion), unary, binary, where, and SwiGLU's silu_mul forward
// and backward. Operands may have any strides (silu_mul_bwd's: contiguous); the chunked driver in loops.h does the
// walking.
#include <cmath>

#include "runtime/kernels/cpu/loops.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/scalar_math.h"

namespace ingot::kernels::cpu {

StridedSpace collapse(const std::vector<const Tensor*>& ops) {
  const Shape& shape = ops[0]->shape();
  StridedSpace sp;
  sp.strides.resize(ops.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;  // size-1 dims contribute nothing
    bool merge = !sp.shape.empty();
    for (size_t k = 0; merge && k < ops.size(); ++k)
      merge = sp.strides[k].back() == ops[k]->strides()[d] * shape[d];
    if (merge) {
      sp.shape.back() *= shape[d];
      for (size_t k = 0; k < ops.size(); ++k) sp.strides[k].back() = ops[k]->strides()[d];
    } else {
      sp.shape.push_back(shape[d]);
      for (size_t k = 0; k < ops.size(); ++k) sp.strides[k].push_back(ops[k]->strides()[d]);
    }
  }
  return sp;
}

void fill(const Tensor& out, double value) {
  if (needs_double({out.dtype()})) {
    elementwise<double, 0>(out, {}, [value](double* o, const double* const*, int64_t n) {
      for (int64_t i = 0; i < n; ++i) o[i] = value;
    });
  } else {
    float v = static_cast<float>(value);
    elementwise<float, 0>(out, {}, [v](float* o, const float* const*, int64_t n) {
      for (int64_t i = 0; i < n; ++i) o[i] = v;
    });
  }
}

void copy(const Tensor& dst, const Tensor& src) {
  INGOT_INTERNAL_CHECK(dst.shape() == src.shape(), "copy: ", shape_str(dst.shape()), " vs ", shape_str(src.shape()));
  // Same dtype, both contiguous: a memcpy.
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  auto body = [](auto* o, const auto* const* in, int64_t n) {
    for (int64_t i = 0; i < n; ++i) o[i] = in[0][i];
  };
  if (needs_double({dst.dtype(), src.dtype()})) elementwise<double, 1>(dst, {&src}, body);
  else elementwise<float, 1>(dst, {&src}, body);
}

namespace {

template <typename A>
void unary_loop(UnaryOp op, A alpha, A* o, const A* x, int64_t n) {
  switch (op) {
#define CASE(OP, EXPR) \
  case UnaryOp::OP:    \
    for (int64_t i = 0; i < n; ++i) { A v = x[i]; o[i] = (EXPR); } \
    break;
    CASE(Neg, -v)
    CASE(Exp, std::exp(v))
    CASE(Log, std::log(v))
    CASE(Sqrt, std::sqrt(v))
    CASE(Rsqrt, A(1) / std::sqrt(v))
    CASE(Abs, std::abs(v))
    CASE(Tanh, std::tanh(v))
    CASE(Sigmoid, ig_math::sigmoid(v))
    CASE(Relu, ig_math::relu(v))
    CASE(GeluTanh, ig_math::gelu_tanh(v))
    CASE(GeluErf, ig_math::gelu_erf(v))
    CASE(Silu, ig_math::silu(v))
    CASE(Sin, std::sin(v))
    CASE(Cos, std::cos(v))
    CASE(Reciprocal, A(1) / v)
    CASE(Square, v * v)
    CASE(Sign, A((v > A(0)) - (v < A(0))))
    CASE(PowScalar, std::pow(v, alpha))
    CASE(AddScalar, v + alpha)
    CASE(MulScalar, v * alpha)
    CASE(RSubScalar, alpha - v)
    CASE(RDivScalar, alpha / v)
    CASE(Log1p, std::log1p(v))
    CASE(Expm1, std::expm1(v))
    CASE(Floor, std::floor(v))
    CASE(LogicalNot, A(v == A(0)))
#undef CASE
  }
}

template <typename A>
void binary_loop(BinaryOp op, A* o, const A* a, const A* b, int64_t n) {
  switch (op) {
#define CASE(OP, EXPR) \
  case BinaryOp::OP:   \
    for (int64_t i = 0; i < n; ++i) { A x = a[i], y = b[i]; o[i] = (EXPR); } \
    break;
    CASE(Add, x + y)
    CASE(Sub, x - y)
    CASE(Mul, x * y)
    CASE(Div, x / y)
    CASE(Pow, std::pow(x, y))
    CASE(Maximum, (x != x || x > y) ? x : y)
    CASE(Minimum, (x != x || x < y) ? x : y)
    CASE(Eq, A(x == y))
    CASE(Ne, A(x != y))
    CASE(Lt, A(x < y))
    CASE(Le, A(x <= y))
    CASE(Gt, A(x > y))
    CASE(Ge, A(x >= y))
    CASE(LogicalAnd, A(x != A(0) && y != A(0)))
    CASE(LogicalOr, A(x != A(0) || y != A(0)))
    CASE(GeluTanhGrad, ig_math::gelu_tanh_grad(x, y))
    CASE(GeluErfGrad, ig_math::gelu_erf_grad(x, y))
    CASE(SiluGrad, ig_math::silu_grad(x, y))
    CASE(SigmoidGradFromOutput, ig_math::sigmoid_grad(x, y))
    CASE(TanhGradFromOutput, ig_math::tanh_grad(x, y))
    CASE(ReluGrad, ig_math::relu_grad(x, y))
#undef CASE
  }
}

}  // namespace

void unary(UnaryOp op, const Tensor& out, const Tensor& in, double alpha) {
  if (needs_double({out.dtype(), in.dtype()})) {
    elementwise<double, 1>(out, {&in}, [&](double* o, const double* const* x, int64_t n) {
      unary_loop<double>(op, alpha, o, x[0], n);
    });
  } else {
    float a = static_cast<float>(alpha);
    elementwise<float, 1>(out, {&in}, [&](float* o, const float* const* x, int64_t n) {
      unary_loop<float>(op, a, o, x[0], n);
    });
  }
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  if (needs_double({out.dtype(), a.dtype(), b.dtype()})) {
    elementwise<double, 2>(out, {&a, &b}, [&](double* o, const double* const* x, int64_t n) {
      binary_loop<double>(op, o, x[0], x[1], n);
    });
  } else {
    elementwise<float, 2>(out, {&a, &b}, [&](float* o, const float* const* x, int64_t n) {
      binary_loop<float>(op, o, x[0], x[1], n);
    });
  }
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  auto body = [](auto* o, const auto* const* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) o[i] = x[0][i] != 0 ? x[1][i] : x[2][i];
  };
  if (needs_double({out.dtype(), a.dtype(), b.dtype()})) elementwise<double, 3>(out, {&cond, &a, &b}, body);
  else elementwise<float, 3>(out, {&cond, &a, &b}, body);
}

void silu_mul_fwd(const Tensor& out, const Tensor& a, const Tensor& b) {
  auto body = [](auto* o, const auto* const* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) o[i] = ig_math::silu(x[0][i]) * x[1][i];
  };
  if (needs_double({out.dtype()})) elementwise<double, 2>(out, {&a, &b}, body);
  else elementwise<float, 2>(out, {&a, &b}, body);
}

void silu_mul_sums_fwd(const Tensor& out, const Tensor& a, const Tensor& da, const Tensor& b, const Tensor& db) {
  auto body = [](auto* o, const auto* const* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) o[i] = ig_math::silu(x[0][i] + x[1][i]) * (x[2][i] + x[3][i]);
  };
  if (needs_double({out.dtype()})) elementwise<double, 4>(out, {&a, &da, &b, &db}, body);
  else elementwise<float, 4>(out, {&a, &da, &b, &db}, body);
}

namespace {

// Two outputs, so not the one-output elementwise driver: contiguous chunks loaded into Acc buffers.
template <typename Acc>
void silu_mul_bwd_typed(const Tensor& da, const Tensor& db, const Tensor& dy, const Tensor& a, const Tensor& b) {
  const int64_t n = a.numel(), chunks = (n + kChunk - 1) / kChunk;
  auto at = [](const Tensor& t, int64_t i) { return static_cast<char*>(t.data_ptr()) + i * itemsize(t.dtype()); };
#pragma omp parallel if (n >= kParallelGrain)
  {
    alignas(64) Acc va[kChunk], vb[kChunk], vdy[kChunk], ga[kChunk], gb[kChunk];
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t start = c * kChunk, m = std::min(kChunk, n - start);
      load_strided<Acc>(a.dtype(), at(a, start), 1, m, va);
      load_strided<Acc>(b.dtype(), at(b, start), 1, m, vb);
      load_strided<Acc>(dy.dtype(), at(dy, start), 1, m, vdy);
      for (int64_t i = 0; i < m; ++i) {
        ga[i] = ig_math::silu_grad(va[i], vdy[i] * vb[i]);
        gb[i] = ig_math::silu(va[i]) * vdy[i];
      }
      if (da.defined()) store_strided<Acc>(da.dtype(), at(da, start), 1, m, ga);
      if (db.defined()) store_strided<Acc>(db.dtype(), at(db, start), 1, m, gb);
    }
  }
}

}  // namespace

void silu_mul_bwd(const Tensor& da, const Tensor& db, const Tensor& dy, const Tensor& a, const Tensor& b) {
  if (needs_double({a.dtype()})) silu_mul_bwd_typed<double>(da, db, dy, a, b);
  else silu_mul_bwd_typed<float>(da, db, dy, a, b);
}

}  // namespace ingot::kernels::cpu
