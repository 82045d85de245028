// The device helpers every generated CUDA program starts with (see render_cuda.h): dtype conversions,
// NaN-propagating max/min, warp and block reductions, vector loads and stores. Plain CUDA C++ for NVRTC; the
// one header is the ops' scalar math (Note [Scalar math written once], runtime/kernels/scalar_math.h), which
// compile_cubins hands NVRTC by name.
#include "compile/codegen/cuda/render_cuda.h"
#include "compile/codegen/common/scalar_math.h"
#include "runtime/sha256.h"

#include <cmath>
#include <cstdio>

namespace ingot::codegen::cuda {

namespace {

// The header.
constexpr const char* kHeader = R"(// ingot generated CUDA kernels (NVRTC): one parameter struct and one or two extern "C" __global__
// functions per kernel. The pointwise ops' formulas are runtime/kernels/scalar_math.h's, the eager kernels' own.
#include "ingot_scalar_math.h"

)";

// bf16 and f16 loads, stores and rounding.
constexpr const char* kConversions = R"(// bf16 is the top half of an f32; rounding to nearest even, NaN kept quiet (as the CPU backend).
__device__ __forceinline__ float ig_ld_bf16(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ unsigned short ig_st_bf16(float f) {
  const unsigned int u = __float_as_uint(f);
  if (f != f) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float ig_round_bf16(float f) { return ig_ld_bf16(ig_st_bf16(f)); }
// f16 through the hardware conversions (round to nearest even).
__device__ __forceinline__ float ig_ld_f16(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short ig_st_f16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float ig_round_f16(float f) { return ig_ld_f16(ig_st_f16(f)); }

)";

// NaN-propagating max and min, the reductions' functors and the warp shuffles.
constexpr const char* kMaxMin = R"(// Max and min that propagate NaN (as the eager kernels do), in every combining order.
template <typename T> __device__ __forceinline__ T ig_max(T a, T b) { return (b != b || b > a) ? b : a; }
template <typename T> __device__ __forceinline__ T ig_min(T a, T b) { return (b != b || b < a) ? b : a; }
__device__ __forceinline__ long long ig_max(long long a, long long b) { return b > a ? b : a; }
__device__ __forceinline__ long long ig_min(long long a, long long b) { return b < a ? b : a; }
struct ig_op_sum { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
struct ig_op_max { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return ig_max(a, b); } };
struct ig_op_min { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return ig_min(a, b); } };

__device__ __forceinline__ float ig_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ double ig_shfl_xor(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ long long ig_shfl_xor(long long v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ bool ig_shfl_xor(bool v, int m) { return __shfl_xor_sync(0xffffffffu, (int)v, m) != 0; }

)";

// Warp, block and column reductions.
constexpr const char* kReductions = R"(// Butterfly: every lane ends with the warp's value, combined in the same order on every lane.
template <typename T, typename F> __device__ __forceinline__ T ig_warp_reduce(T v, F f) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = f(v, ig_shfl_xor(v, m));
  return v;
}
// Every thread of the block gets the block's value (warp partials through `sm`, 32 slots); the trailing
// barrier lets the caller reuse `sm` for the next row.
template <typename T, typename F> __device__ __forceinline__ T ig_block_reduce(T v, F f, T* sm) {
  v = ig_warp_reduce(v, f);
  const int nw = (blockDim.x + 31) >> 5;
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = sm[0];
  for (int w = 1; w < nw; ++w) r = f(r, sm[w]);
  __syncthreads();
  return r;
}

// Rows on threadIdx.x, their columns split over threadIdx.y: every thread gets its row's value (partials
// through `sm`, blockDim.x * blockDim.y <= 1024 slots).
template <typename T, typename F> __device__ __forceinline__ T ig_col_reduce(T v, F f, T* sm) {
  sm[threadIdx.y * blockDim.x + threadIdx.x] = v;
  __syncthreads();
  T r = sm[threadIdx.x];
  for (unsigned int y = 1; y < blockDim.y; ++y) r = f(r, sm[y * blockDim.x + threadIdx.x]);
  __syncthreads();
  return r;
}

)";

// Vector loads and stores.
constexpr const char* kVectors = R"(// N consecutive elements in 16-byte (or narrower) transactions; `s` is aligned to min(16, N * sizeof(T)).
struct __align__(16) ig_v16 { unsigned int x, y, z, w; };
struct __align__(8) ig_v8 { unsigned int x, y; };
template <int N, typename T> __device__ __forceinline__ void ig_ldv(T (&d)[N], const T* s) {
  constexpr int B = N * (int)sizeof(T);
  if constexpr (B % 16 == 0) {
#pragma unroll
    for (int k = 0; k < B / 16; ++k) reinterpret_cast<ig_v16*>(d)[k] = reinterpret_cast<const ig_v16*>(s)[k];
  } else if constexpr (B % 8 == 0) {
#pragma unroll
    for (int k = 0; k < B / 8; ++k) reinterpret_cast<ig_v8*>(d)[k] = reinterpret_cast<const ig_v8*>(s)[k];
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) d[k] = s[k];
  }
}
template <int N, typename T> __device__ __forceinline__ void ig_stv(T* d, const T (&s)[N]) {
  constexpr int B = N * (int)sizeof(T);
  if constexpr (B % 16 == 0) {
#pragma unroll
    for (int k = 0; k < B / 16; ++k) reinterpret_cast<ig_v16*>(d)[k] = reinterpret_cast<const ig_v16*>(s)[k];
  } else if constexpr (B % 8 == 0) {
#pragma unroll
    for (int k = 0; k < B / 8; ++k) reinterpret_cast<ig_v8*>(d)[k] = reinterpret_cast<const ig_v8*>(s)[k];
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) d[k] = s[k];
  }
}
)";

}  // namespace

std::string render_preamble() {
  return std::string(kHeader) + kConversions + kMaxMin + kReductions + kVectors;
}

const std::string& renderer_fingerprint() {
  static const std::string fp = [] {
    std::string text = render_preamble() + scalar_math_source();
    // Pointwise: every unary and binary op, where, casts to the narrow types, indices, scalars, constants,
    // on a vectorizable layout.
    KernelSpec pw;
    pw.name = "probe_pointwise";
    pw.dims = {SymInt::slot(0), SymInt::constant(8)};
    pw.num_syms = 1;
    const int x = pw.load(pw.input(DType::f32, {SymInt::constant(8), SymInt::constant(1)}));
    const int z = pw.load(pw.input(DType::f64, {SymInt::constant(0), SymInt::constant(1)}));
    const int i = pw.load(pw.input(DType::i32, {SymInt::constant(8), SymInt::constant(1)}));
    int acc = pw.binary(Op::Add, pw.scalar(0, DType::f32), pw.constant(-INFINITY, DType::f32));
    acc = pw.binary(Op::Mul, acc, pw.constant(0.1, DType::f32));  // how finite constants are written
    for (int op = static_cast<int>(Op::Neg); op < static_cast<int>(Op::Cast); ++op)
      acc = pw.binary(Op::Add, acc, pw.unary(static_cast<Op>(op), x));
    for (int op = static_cast<int>(Op::Add); op <= static_cast<int>(Op::RoundBf16Stochastic); ++op)
      acc = pw.where(pw.cast(pw.binary(static_cast<Op>(op), x, z), DType::b8), acc, pw.cast(i, DType::f32));
    acc = pw.binary(Op::Add, acc, pw.cast(pw.index(1), DType::f32));
    pw.store(pw.output(DType::bf16, {SymInt::constant(8), SymInt::constant(1)}), pw.cast(acc, DType::f16));
    pw.store(pw.output(DType::b8, {SymInt::constant(8), SymInt::constant(1)}), pw.cast(acc, DType::b8));
    text += render_kernel(pw, "p0").source;
    // Row reduction: two phases, row and element outputs, every reduction, vectorizable.
    KernelSpec rr;
    rr.kind = KernelKind::RowReduction;
    rr.name = "probe_rows";
    rr.dims = {SymInt::constant(2), SymInt::constant(16)};
    const int rx = rr.load(rr.input(DType::bf16, rr.contiguous_strides()));
    const int m = rr.reduce(Op::ReduceMax, rx);
    const int s = rr.reduce(Op::ReduceSum, rr.binary(Op::Sub, rx, m));
    rr.store(rr.output(DType::f32, {SymInt::constant(1), SymInt::constant(0)}),
             rr.binary(Op::Add, s, rr.reduce(Op::ReduceMin, rx)));
    rr.store(rr.output(DType::f32, rr.contiguous_strides()), rr.binary(Op::Div, rx, s));
    text += render_kernel(rr, "p1").source;
    KernelSpec one = rr;
    one.name = "probe_one_row";
    one.dims = {SymInt::constant(5)};
    for (Buffer& b : one.buffers) b.strides.erase(b.strides.begin());
    text += render_kernel(one, "p2").source;
    // Column sums (Note [Column sums in row reductions]): the warp kernel's shared rows and the _colfin pass.
    KernelSpec cs = rr;
    cs.name = "probe_column_sums";
    cs.store(cs.output(DType::f32, {SymInt::constant(0), SymInt::constant(1)}), cs.column_sum(rx));
    text += render_kernel(cs, "p4").source;
    // Multi-tensor, in place.
    KernelSpec mt;
    mt.kind = KernelKind::MultiTensor;
    mt.name = "probe_multi";
    const int p = mt.input(DType::f32, {});
    mt.store(mt.output(DType::f32, {}, "", p), mt.binary(Op::Mul, mt.load(p), mt.scalar(0, DType::f32)));
    text += render_kernel(mt, "p3").source;
    const uint64_t h = Key64().add(text).value();
    char buf[48];
    std::snprintf(buf, sizeof buf, "cuda-renderer-%016llx", static_cast<unsigned long long>(h));
    return std::string(buf);
  }();
  return fp;
}

}  // namespace ingot::codegen::cuda
