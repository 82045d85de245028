// CUDA elementwise kernels: fill, copy (with dtype conversion), unary, binary, where, over operands of any
// strides (stride 0 = broadcast) and any mix of dtypes; and SwiGLU's silu_mul forward (the same driver) and
// backward (two outputs: its own kernel over contiguous operands of one dtype).
//
// Approach: the host collapses the operands' dims (dropping size-1 dims, merging dims that are contiguous in
// every operand) into at most kMaxDims dims and passes sizes, strides, pointers and dtypes by value in one
// small struct. A grid-stride loop maps each linear output index to per-operand offsets: directly when one
// dim is left (the contiguous and 1-d cases), else by div/mod over the collapsed sizes, in 32-bit arithmetic
// when the element count allows. Operands are loaded into the accumulation type (f32 for f32/bf16/f16, f64
// when f64 or an integer type is involved, as on the CPU), the op runs, and the result is stored converted.
// The op and the dtypes are switched on at run time inside the loop: the switch is uniform across the grid,
// costs a few instructions per element (well under the memory-bound budget), and keeps the number of kernel
// instantiations small.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "runtime/kernels/cuda/common.cuh"
#include "runtime/kernels/cuda/row_common.cuh"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/scalar_math.h"

namespace ingot::kernels::cuda {
namespace {

constexpr int kMaxDims = 8;
constexpr int kBlock = 256;

// N operands, the output first.
template <int N>
struct Operands {
  void* data[N];
  DType dtype[N];
  int ndim;
  int64_t sizes[kMaxDims];
  int64_t strides[N][kMaxDims];
};

enum class Mode { Linear, Strided32, Strided64 };

// Operands share out's shape. Size-1 dims are dropped; adjacent dims merge when every operand steps through
// them as through one dim.
template <int N>
Operands<N> collapse(const char* op, const std::array<const Tensor*, N>& ts) {
  Operands<N> a{};
  const Shape& shape = ts[0]->shape();
  a.ndim = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = a.ndim > 0;
    for (int k = 0; merge && k < N; ++k)
      merge = a.strides[k][a.ndim - 1] == ts[k]->strides()[d] * shape[d];
    if (merge) {
      a.sizes[a.ndim - 1] *= shape[d];
      for (int k = 0; k < N; ++k) a.strides[k][a.ndim - 1] = ts[k]->strides()[d];
      continue;
    }
    INGOT_CHECK(a.ndim < kMaxDims, op, ": CUDA elementwise kernels support up to ", kMaxDims,
                " non-mergeable dims, got shape ", shape_str(shape));
    a.sizes[a.ndim] = shape[d];
    for (int k = 0; k < N; ++k) a.strides[k][a.ndim] = ts[k]->strides()[d];
    ++a.ndim;
  }
  if (a.ndim == 0) {  // a single element
    a.ndim = 1;
    a.sizes[0] = 1;
    for (int k = 0; k < N; ++k) a.strides[k][0] = 0;
  }
  for (int k = 0; k < N; ++k) {
    a.data[k] = ts[k]->data_ptr();
    a.dtype[k] = ts[k]->dtype();
  }
  return a;
}

template <int N, Mode M>
__device__ __forceinline__ void offsets(const Operands<N>& a, int64_t i, int64_t (&off)[N]) {
  if constexpr (M == Mode::Linear) {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = i * a.strides[k][0];
  } else {
    using Index = std::conditional_t<M == Mode::Strided32, uint32_t, uint64_t>;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    Index rem = static_cast<Index>(i);
#pragma unroll
    for (int d = kMaxDims - 1; d >= 0; --d) {
      if (d >= a.ndim) continue;
      Index size = static_cast<Index>(a.sizes[d]);
      Index idx = rem % size;
      rem /= size;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(idx) * a.strides[k][d];
    }
  }
}

// out[i] = f(in_1[i], ..., in_{N-1}[i]) for every element.
template <typename Acc, int N, Mode M, typename F>
__global__ void elementwise_kernel(Operands<N> a, int64_t numel, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += step) {
    int64_t off[N];
    offsets<N, M>(a, i, off);
    Acc in[N > 1 ? N - 1 : 1];
#pragma unroll
    for (int k = 1; k < N; ++k) in[k - 1] = load_dyn<Acc>(a.data[k], a.dtype[k], off[k]);
    store_dyn<Acc>(a.data[0], a.dtype[0], off[0], f(in));
  }
}

// Note [Contiguous elementwise in vectors]: the general kernel above loads and stores one element per operand and
// iteration through a dtype switch; on dense operands that left an H200 at 1.5 TB/s for a bf16 mul and 2.5 TB/s for
// an f32 -> bf16 copy (bench_cuda_kernels, bench/RESULTS.md 2026-11-27), the copy being, for one, what every eager
// and compiled ZeRO-3 gather runs on its f32 master shard first. When every operand is dense (one collapsed dim
// of stride 1), 16-byte aligned and f32 / bf16 / f16, each thread takes kVec elements per operand with 16-byte
// loads and stores (two per operand for f32), switching on the dtypes once per vector; the last numel % kVec
// elements take the scalar path. The math is the same functor on the same f32 values, so results are
// bit-identical to the general kernel's. INGOT_CUDA_DENSE_VEC=0 sends everything to the general kernel (to measure
// one against the other in one process: bench/RESULTS.md).
constexpr int kVec = 8;

bool dense_vec_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("INGOT_CUDA_DENSE_VEC");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

// kVec elements from element i as f32 / into element i from f32, in any of the three dtypes: rowwise's 16-byte
// packs (f32 as two packs of 4), switched on the dtype once per vector.
__device__ __forceinline__ void load_dense(const void* base, DType dt, int64_t i, float (&v)[kVec]) {
  if (dt == DType::f32) {
    const float* p = static_cast<const float*>(base) + i;
    float lo[kVec / 2], hi[kVec / 2];
    rowwise::load_vec<kVec / 2>(p, lo);
    rowwise::load_vec<kVec / 2>(p + kVec / 2, hi);
#pragma unroll
    for (int j = 0; j < kVec / 2; ++j) v[j] = lo[j], v[kVec / 2 + j] = hi[j];
  } else if (dt == DType::bf16) {
    rowwise::load_vec<kVec>(static_cast<const bf16*>(base) + i, v);
  } else {  // f16 (dense_vectorizable admits nothing else)
    rowwise::load_vec<kVec>(static_cast<const half*>(base) + i, v);
  }
}

__device__ __forceinline__ void store_dense(void* base, DType dt, int64_t i, const float (&v)[kVec]) {
  if (dt == DType::f32) {
    float* p = static_cast<float*>(base) + i;
    float lo[kVec / 2], hi[kVec / 2];
#pragma unroll
    for (int j = 0; j < kVec / 2; ++j) lo[j] = v[j], hi[j] = v[kVec / 2 + j];
    rowwise::store_vec<kVec / 2>(p, lo);
    rowwise::store_vec<kVec / 2>(p + kVec / 2, hi);
  } else if (dt == DType::bf16) {
    rowwise::store_vec<kVec>(static_cast<bf16*>(base) + i, v);
  } else {
    rowwise::store_vec<kVec>(static_cast<half*>(base) + i, v);
  }
}

template <int N, typename F>
__global__ void dense_vec_kernel(Operands<N> a, int64_t numel, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vecs = numel / kVec;
  for (int64_t v = first; v < vecs; v += step) {
    float in[N - 1][kVec];
#pragma unroll
    for (int k = 1; k < N; ++k) load_dense(a.data[k], a.dtype[k], v * kVec, in[k - 1]);
    float out[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float x[N - 1];
#pragma unroll
      for (int k = 0; k < N - 1; ++k) x[k] = in[k][j];
      out[j] = f(x);
    }
    store_dense(a.data[0], a.dtype[0], v * kVec, out);
  }
  for (int64_t i = vecs * kVec + first; i < numel; i += step) {  // the tail, element by element
    float x[N - 1];
#pragma unroll
    for (int k = 1; k < N; ++k) x[k - 1] = load_dyn<float>(a.data[k], a.dtype[k], i);
    store_dyn<float>(a.data[0], a.dtype[0], i, f(x));
  }
}

// Whether Note [Contiguous elementwise in vectors] applies to the collapsed operands.
template <int N>
bool dense_vectorizable(const Operands<N>& a, int64_t numel) {
  if (N < 2 || a.ndim != 1 || numel < kVec || !dense_vec_enabled()) return false;
  for (int k = 0; k < N; ++k) {
    const DType d = a.dtype[k];
    if (a.strides[k][0] != 1 || (d != DType::f32 && d != DType::bf16 && d != DType::f16) ||
        reinterpret_cast<uintptr_t>(a.data[k]) % 16 != 0)
      return false;
  }
  return true;
}

template <typename Acc, int N, typename F>
void launch(const char* op, const std::array<const Tensor*, N>& ts, F f) {
  const Tensor& out = *ts[0];
  for (int k = 1; k < N; ++k)
    INGOT_INTERNAL_CHECK(ts[k]->shape() == out.shape(), op, ": operand ", k, " has shape ",
                         shape_str(ts[k]->shape()), ", expected ", shape_str(out.shape()));
  const int64_t numel = out.numel();
  if (numel == 0) return;
  Operands<N> a = collapse<N>(op, ts);
  LaunchContext ctx(out);
  if constexpr (std::is_same_v<Acc, float> && N >= 2) {
    if (dense_vectorizable<N>(a, numel)) {
      dense_vec_kernel<N><<<grid_for(numel / kVec, kBlock, ctx.device), kBlock, 0, ctx.stream>>>(a, numel, f);
      CUDA_CHECK_LAUNCH();
      return;
    }
  }
  const unsigned grid = grid_for(numel, kBlock, ctx.device);
  if (a.ndim == 1) {
    elementwise_kernel<Acc, N, Mode::Linear><<<grid, kBlock, 0, ctx.stream>>>(a, numel, f);
  } else if (numel <= INT32_MAX) {
    elementwise_kernel<Acc, N, Mode::Strided32><<<grid, kBlock, 0, ctx.stream>>>(a, numel, f);
  } else {
    elementwise_kernel<Acc, N, Mode::Strided64><<<grid, kBlock, 0, ctx.stream>>>(a, numel, f);
  }
  CUDA_CHECK_LAUNCH();
}

// As on the CPU: f64 math whenever f64 or an integer type takes part.
bool needs_double(std::initializer_list<DType> ts) {
  for (DType t : ts)
    if (t == DType::f64 || t == DType::i64 || t == DType::i32) return true;
  return false;
}

// The math of the activations and their gradients: runtime/kernels/scalar_math.h (Note [Scalar math written
// once]).

template <typename A>
struct FillFn {
  A value;
  __device__ A operator()(const A (&)[1]) const { return value; }
};

template <typename A>
struct CopyFn {
  __device__ A operator()(const A (&x)[1]) const { return x[0]; }
};

template <typename A>
struct UnaryFn {
  UnaryOp op;
  A alpha;
  __device__ A operator()(const A (&x)[1]) const {
    const A v = x[0];
    switch (op) {
      case UnaryOp::Neg: return -v;
      case UnaryOp::Exp: return exp(v);
      case UnaryOp::Log: return log(v);
      case UnaryOp::Sqrt: return sqrt(v);
      case UnaryOp::Rsqrt: return A(1) / sqrt(v);
      case UnaryOp::Abs: return fabs(v);
      case UnaryOp::Tanh: return tanh(v);
      case UnaryOp::Sigmoid: return ig_math::sigmoid(v);
      case UnaryOp::Relu: return ig_math::relu(v);
      case UnaryOp::GeluTanh: return ig_math::gelu_tanh(v);
      case UnaryOp::GeluErf: return ig_math::gelu_erf(v);
      case UnaryOp::Silu: return ig_math::silu(v);
      case UnaryOp::Sin: return sin(v);
      case UnaryOp::Cos: return cos(v);
      case UnaryOp::Reciprocal: return A(1) / v;
      case UnaryOp::Square: return v * v;
      case UnaryOp::Sign: return A((v > A(0)) - (v < A(0)));
      case UnaryOp::PowScalar: return pow(v, alpha);
      case UnaryOp::AddScalar: return v + alpha;
      case UnaryOp::MulScalar: return v * alpha;
      case UnaryOp::RSubScalar: return alpha - v;
      case UnaryOp::RDivScalar: return alpha / v;
      case UnaryOp::Log1p: return log1p(v);
      case UnaryOp::Expm1: return expm1(v);
      case UnaryOp::Floor: return floor(v);
      case UnaryOp::LogicalNot: return A(v == A(0));
    }
    return A(0);
  }
};

template <typename A>
struct BinaryFn {
  BinaryOp op;
  __device__ A operator()(const A (&in)[2]) const {
    const A x = in[0], y = in[1];
    switch (op) {
      case BinaryOp::Add: return x + y;
      case BinaryOp::Sub: return x - y;
      case BinaryOp::Mul: return x * y;
      case BinaryOp::Div: return x / y;
      case BinaryOp::Pow: return pow(x, y);
      case BinaryOp::Maximum: return (x != x || x > y) ? x : y;  // NaN propagates, as on the CPU
      case BinaryOp::Minimum: return (x != x || x < y) ? x : y;
      case BinaryOp::Eq: return A(x == y);
      case BinaryOp::Ne: return A(x != y);
      case BinaryOp::Lt: return A(x < y);
      case BinaryOp::Le: return A(x <= y);
      case BinaryOp::Gt: return A(x > y);
      case BinaryOp::Ge: return A(x >= y);
      case BinaryOp::LogicalAnd: return A(x != A(0) && y != A(0));
      case BinaryOp::LogicalOr: return A(x != A(0) || y != A(0));
      case BinaryOp::GeluTanhGrad: return ig_math::gelu_tanh_grad(x, y);
      case BinaryOp::GeluErfGrad: return ig_math::gelu_erf_grad(x, y);
      case BinaryOp::SiluGrad: return ig_math::silu_grad(x, y);
      case BinaryOp::SigmoidGradFromOutput: return ig_math::sigmoid_grad(x, y);
      case BinaryOp::TanhGradFromOutput: return ig_math::tanh_grad(x, y);
      case BinaryOp::ReluGrad: return ig_math::relu_grad(x, y);
    }
    return A(0);
  }
};

template <typename A>
struct WhereFn {
  __device__ A operator()(const A (&x)[3]) const { return x[0] != A(0) ? x[1] : x[2]; }
};

template <typename A>
struct SiluMulFn {
  __device__ A operator()(const A (&x)[2]) const { return ig_math::silu(x[0]) * x[1]; }
};

template <typename A>
struct SiluMulSumsFn {
  __device__ A operator()(const A (&x)[4]) const { return ig_math::silu(x[0] + x[1]) * (x[2] + x[3]); }
};

// da, db (either may be null), dy, a, b: n contiguous elements of T each.
template <typename T>
__global__ void silu_mul_bwd_kernel(T* da, T* db, const T* dy, const T* a, const T* b, int64_t n) {
  using A = acc_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const A x = to_acc<A>(a[i]), y = to_acc<A>(b[i]), g = to_acc<A>(dy[i]);
    if (da) da[i] = from_acc<T>(ig_math::silu_grad(x, g * y));
    if (db) db[i] = from_acc<T>(ig_math::silu(x) * g);
  }
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------------------------

void fill(const Tensor& out, double value) {
  check_same_device("fill", {&out});
  if (needs_double({out.dtype()})) launch<double, 1>("fill", {&out}, FillFn<double>{value});
  else launch<float, 1>("fill", {&out}, FillFn<float>{static_cast<float>(value)});
}

// Note [Row copies]: a same-dtype copy whose last dim is contiguous in both tensors (a transpose of leading
// dims, e.g. attention's [B, T, H, D] <-> [B, H, T, D], or a reshape of such a view) moves whole rows: each
// thread copies 16 bytes and computes the row's offsets once per 16 bytes instead of per element. The generic
// kernel below converts element by element through the accumulation type, which is several times slower.
struct RowCopy {
  const char* src;
  char* dst;
  int outer;  // leading dims
  int64_t sizes[kMaxDims];
  int64_t src_strides[kMaxDims], dst_strides[kMaxDims];  // bytes
  int64_t vecs_per_row;
  int64_t total;  // rows * vecs_per_row
};

__global__ void row_copy_kernel(RowCopy p) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < p.total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t row = i / p.vecs_per_row;
    const int64_t v = i - row * p.vecs_per_row;
    int64_t so = 0, d_o = 0;
    for (int d = p.outer - 1; d >= 0; --d) {
      const int64_t c = row % p.sizes[d];
      row /= p.sizes[d];
      so += c * p.src_strides[d];
      d_o += c * p.dst_strides[d];
    }
    reinterpret_cast<uint4*>(p.dst + d_o)[v] = reinterpret_cast<const uint4*>(p.src + so)[v];
  }
}

// Whether the row kernel applies (same dtype, last dim contiguous, everything 16-byte aligned); launches it.
bool try_row_copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype() || dst.dim() < 2 || dst.dim() - 1 > kMaxDims) return false;
  const int64_t esz = static_cast<int64_t>(itemsize(dst.dtype()));
  const int64_t last = dst.dim() - 1;
  if (dst.strides()[static_cast<size_t>(last)] != 1 || src.strides()[static_cast<size_t>(last)] != 1) return false;
  const int64_t row_bytes = dst.size(last) * esz;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (row_bytes % 16 != 0 || !aligned(dst.data_ptr()) || !aligned(src.data_ptr())) return false;
  RowCopy p{};
  p.src = static_cast<const char*>(src.data_ptr());
  p.dst = static_cast<char*>(dst.data_ptr());
  p.outer = static_cast<int>(last);
  for (int64_t d = 0; d < last; ++d) {
    p.sizes[d] = dst.size(d);
    p.src_strides[d] = src.strides()[static_cast<size_t>(d)] * esz;
    p.dst_strides[d] = dst.strides()[static_cast<size_t>(d)] * esz;
    if (p.src_strides[d] % 16 != 0 || p.dst_strides[d] % 16 != 0) return false;
  }
  p.vecs_per_row = row_bytes / 16;
  p.total = dst.numel() / dst.size(last) * p.vecs_per_row;
  LaunchContext ctx(dst);
  row_copy_kernel<<<grid_for(p.total, kBlock, ctx.device), kBlock, 0, ctx.stream>>>(p);
  CUDA_CHECK_LAUNCH();
  return true;
}

void copy(const Tensor& dst, const Tensor& src) {
  check_same_device("copy", {&dst, &src});
  INGOT_INTERNAL_CHECK(dst.shape() == src.shape(), "copy: ", shape_str(dst.shape()), " vs ", shape_str(src.shape()));
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    LaunchContext ctx(dst);
    CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, ctx.stream));
    return;
  }
  if (try_row_copy(dst, src)) return;
  if (needs_double({dst.dtype(), src.dtype()})) launch<double, 2>("copy", {&dst, &src}, CopyFn<double>{});
  else launch<float, 2>("copy", {&dst, &src}, CopyFn<float>{});
}

void unary(UnaryOp op, const Tensor& out, const Tensor& in, double alpha) {
  check_same_device(unary_name(op), {&out, &in});
  if (needs_double({out.dtype(), in.dtype()}))
    launch<double, 2>(unary_name(op), {&out, &in}, UnaryFn<double>{op, alpha});
  else
    launch<float, 2>(unary_name(op), {&out, &in}, UnaryFn<float>{op, static_cast<float>(alpha)});
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  check_same_device(binary_name(op), {&out, &a, &b});
  if (needs_double({out.dtype(), a.dtype(), b.dtype()}))
    launch<double, 3>(binary_name(op), {&out, &a, &b}, BinaryFn<double>{op});
  else
    launch<float, 3>(binary_name(op), {&out, &a, &b}, BinaryFn<float>{op});
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_same_device("where", {&out, &cond, &a, &b});
  if (needs_double({out.dtype(), a.dtype(), b.dtype()}))
    launch<double, 4>("where", {&out, &cond, &a, &b}, WhereFn<double>{});
  else
    launch<float, 4>("where", {&out, &cond, &a, &b}, WhereFn<float>{});
}

void silu_mul_fwd(const Tensor& out, const Tensor& a, const Tensor& b) {
  check_same_device("silu_mul", {&out, &a, &b});
  if (needs_double({out.dtype()})) launch<double, 3>("silu_mul", {&out, &a, &b}, SiluMulFn<double>{});
  else launch<float, 3>("silu_mul", {&out, &a, &b}, SiluMulFn<float>{});
}

void silu_mul_sums_fwd(const Tensor& out, const Tensor& a, const Tensor& da, const Tensor& b, const Tensor& db) {
  check_same_device("silu_mul_sums", {&out, &a, &da, &b, &db});
  if (needs_double({out.dtype()}))
    launch<double, 5>("silu_mul_sums", {&out, &a, &da, &b, &db}, SiluMulSumsFn<double>{});
  else
    launch<float, 5>("silu_mul_sums", {&out, &a, &da, &b, &db}, SiluMulSumsFn<float>{});
}

void silu_mul_bwd(const Tensor& da, const Tensor& db, const Tensor& dy, const Tensor& a, const Tensor& b) {
  check_same_device("silu_mul_bwd", {&da, &db, &dy, &a, &b});
  const int64_t n = a.numel();
  if (n == 0) return;
  LaunchContext ctx(a);
  dispatch_float(a.dtype(), "silu_mul_bwd", [&](auto tag) {
    using T = decltype(tag);
    auto ptr = [](const Tensor& t) { return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr; };
    silu_mul_bwd_kernel<T><<<grid_for(n, kBlock, ctx.device), kBlock, 0, ctx.stream>>>(
        ptr(da), ptr(db), ptr(dy), ptr(a), ptr(b), n);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace ingot::kernels::cuda
