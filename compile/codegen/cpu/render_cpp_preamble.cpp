// The C++ renderer's preamble (the helpers every generated translation unit starts with: dtype conversions,
// NaN-propagating reductions, vector math declarations) and its fingerprint (render_cpp.h).
#include <cmath>
#include <cstdio>

#include "compile/codegen/common/scalar_math.h"
#include "compile/codegen/cpu/render_cpp.h"
#include "runtime/sha256.h"

namespace ingot::codegen::cpu {

namespace {

// The header, and libgomp's one function the kernels call.
constexpr const char* kHeader = R"(// ingot generated kernels: plain C++17 + OpenMP, one extern "C" function per kernel. Math goes through
// compiler builtins; the headers are <stdint.h> and the ops' scalar math, runtime/kernels/scalar_math.h (the
// eager kernels' own formulas), which the codegen writes next to this file.
#include <stdint.h>
#include "ingot_scalar_math.h"

extern "C" int omp_get_max_threads(void);  // from libgomp (omp.h is not needed for one declaration)

)";

// Vector math: glibc's libmvec versions of the math functions the loops call.
constexpr const char* kVectorMath = R"(#if defined(INGOT_JIT_MVEC) && defined(__x86_64__)
// glibc's libmvec has vector versions of these; declaring them `omp declare simd` (what math.h does only
// under -ffast-math, which we do not use: it assumes no NaN/inf and sets flush-to-zero process-wide) lets
// the loops that call them vectorize.
extern "C" {
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
float expm1f(float);
#pragma omp declare simd notinbranch
float log1pf(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float sinf(float);
#pragma omp declare simd notinbranch
float cosf(float);
#pragma omp declare simd notinbranch
double exp(double);
#pragma omp declare simd notinbranch
double log(double);
#pragma omp declare simd notinbranch
double tanh(double);
#pragma omp declare simd notinbranch
double erf(double);
}
#endif

)";

// OpenMP reductions that propagate NaN.
constexpr const char* kNanReductions = R"(// Max and min that propagate NaN (as the eager reductions do), also when OpenMP combines lanes and threads;
// the accumulator starts at the identity, so the original value is a valid initializer.
#pragma omp declare reduction(ig_max : float, double, int64_t : \
    omp_out = (omp_in != omp_in || omp_in > omp_out) ? omp_in : omp_out) initializer(omp_priv = omp_orig)
#pragma omp declare reduction(ig_min : float, double, int64_t : \
    omp_out = (omp_in != omp_in || omp_in < omp_out) ? omp_in : omp_out) initializer(omp_priv = omp_orig)

)";

// bf16 and f16 loads, stores and rounding.
constexpr const char* kConversions = R"(namespace {

// bf16 is the top half of an f32; rounding to nearest even, NaN kept quiet.
inline float ig_ld_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint16_t ig_st_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if (f != f) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float ig_round_bf16(float f) { return ig_ld_bf16(ig_st_bf16(f)); }

#if defined(__FLT16_MAX__)
// The compiler's half type: conversions are exact IEEE (round to nearest even), in hardware with F16C.
inline float ig_ld_f16(uint16_t h) {
  _Float16 x;
  __builtin_memcpy(&x, &h, 2);
  return static_cast<float>(x);
}
inline uint16_t ig_st_f16(float f) {
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  __builtin_memcpy(&h, &x, 2);
  return h;
}
#else
inline float ig_ld_f16(uint16_t h) {
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float mag;
  if (e == 0) {
    mag = static_cast<float>(m) * 5.9604644775390625e-8f;  // subnormal: m * 2^-24, exact
  } else if (e == 31) {
    mag = m ? __builtin_nanf("") : __builtin_inff();
  } else {
    const uint32_t u = ((e + 112u) << 23) | (m << 13);
    __builtin_memcpy(&mag, &u, 4);
  }
  return (h & 0x8000u) ? -mag : mag;
}
inline uint16_t ig_st_f16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = __builtin_fabsf(f);
  if (a != a) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (a < 6.103515625e-5f) return sign | static_cast<uint16_t>(__builtin_nearbyintf(a * 16777216.0f));  // subnormal
  const uint32_t e = ((u >> 23) & 0xffu) - 112u, m = u & 0x7fffffu;
  uint32_t h = (e << 10) | (m >> 13);
  const uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is correct
  return sign | static_cast<uint16_t>(h);
}
#endif
inline float ig_round_f16(float f) { return ig_ld_f16(ig_st_f16(f)); }

}  // namespace
)";

}  // namespace

std::string render_preamble() {
  return std::string(kHeader) + kVectorMath + kNanReductions + kConversions;
}

const std::string& renderer_fingerprint() {
  static const std::string fp = [] {
    std::string text = render_preamble() + scalar_math_source();
    // Pointwise: every unary and binary op, where, casts to the narrow types, indices, scalars, constants.
    KernelSpec pw;
    pw.name = "probe_pointwise";
    pw.dims = {SymInt::slot(0), SymInt::constant(3)};
    pw.num_syms = 1;
    const int x = pw.load(pw.input(DType::f32, {SymInt::constant(3), SymInt::constant(1)}));
    const int z = pw.load(pw.input(DType::f64, {SymInt::constant(0), SymInt::constant(1)}));
    const int i = pw.load(pw.input(DType::i32, {SymInt::constant(3), SymInt::constant(1)}));
    int acc = pw.binary(Op::Add, pw.scalar(0, DType::f32), pw.constant(-INFINITY, DType::f32));
    acc = pw.binary(Op::Add, acc, pw.constant(0.1, DType::f32));  // how finite constants are written
    for (int op = static_cast<int>(Op::Neg); op < static_cast<int>(Op::Cast); ++op)
      acc = pw.binary(Op::Add, acc, pw.unary(static_cast<Op>(op), x));
    for (int op = static_cast<int>(Op::Add); op <= static_cast<int>(Op::RoundBf16Stochastic); ++op)
      acc = pw.where(pw.cast(pw.binary(static_cast<Op>(op), x, z), DType::b8), acc, pw.cast(i, DType::f32));
    acc = pw.binary(Op::Add, acc, pw.cast(pw.index(0), DType::f32));
    pw.store(pw.output(DType::bf16, {SymInt::constant(3), SymInt::constant(1)}), pw.cast(acc, DType::f16));
    pw.store(pw.output(DType::b8, {SymInt::constant(3), SymInt::constant(1)}), pw.cast(acc, DType::b8));
    text += render_kernel(pw, "p0");
    // Row reduction: two phases, row and element outputs, every reduction.
    KernelSpec rr;
    rr.kind = KernelKind::RowReduction;
    rr.name = "probe_rows";
    rr.dims = {SymInt::constant(2), SymInt::constant(5)};
    const int rx = rr.load(rr.input(DType::bf16, rr.contiguous_strides()));
    const int m = rr.reduce(Op::ReduceMax, rx);
    const int s = rr.reduce(Op::ReduceSum, rr.binary(Op::Sub, rx, m));
    rr.store(rr.output(DType::f32, {SymInt::constant(1), SymInt::constant(0)}),
             rr.binary(Op::Add, s, rr.reduce(Op::ReduceMin, rx)));
    rr.store(rr.output(DType::f32, rr.contiguous_strides()), rr.binary(Op::Div, rx, s));
    text += render_kernel(rr, "p1");
    KernelSpec one = rr;
    one.name = "probe_one_row";
    one.dims = {SymInt::constant(5)};
    for (Buffer& b : one.buffers) b.strides.erase(b.strides.begin());
    text += render_kernel(one, "p2");
    // Multi-tensor, in place.
    KernelSpec mt;
    mt.kind = KernelKind::MultiTensor;
    mt.name = "probe_multi";
    const int p = mt.input(DType::f32, {});
    mt.store(mt.output(DType::f32, {}, "", p), mt.binary(Op::Mul, mt.load(p), mt.scalar(0, DType::f32)));
    text += render_kernel(mt, "p3");
    const uint64_t h = Key64().add(text).value();
    char buf[32];
    std::snprintf(buf, sizeof buf, "renderer-%016llx", static_cast<unsigned long long>(h));
    return std::string(buf);
  }();
  return fp;
}

}  // namespace ingot::codegen::cpu
