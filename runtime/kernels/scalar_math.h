// Note [Scalar math written once]: the formula of every pointwise op that is more than one operator or one
// library call (activations and their gradients), for one element, in the compute type T (float for
// f32 / bf16 / f16, double for f64). Four places evaluate these ops and all of them call this header, so eager
// and compiled results cannot drift apart:
//   the eager CPU kernels (runtime/kernels/cpu/elementwise.cpp, g++),
//   the eager CUDA kernels (runtime/kernels/cuda/elementwise.cu, nvcc),
//   the generated CPU kernels (compile/codegen/cpu: their source #includes this file by name),
//   the generated CUDA kernels (compile/codegen/cuda: NVRTC gets this file as a named header).
// So it includes nothing and uses only what each of those has without headers: the compiler's math builtins
// on the host, CUDA's math functions on the device. The generated kernels' cache keys hash its text
// (compile/codegen/common/scalar_math.h), so a changed formula recompiles them.
//
// Gradients take (x, dy) and return dy * f'(x); sigmoid_grad and tanh_grad take the op's output y instead of x.
#ifndef INGOT_RUNTIME_KERNELS_SCALAR_MATH_H_
#define INGOT_RUNTIME_KERNELS_SCALAR_MATH_H_

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define INGOT_MATH_FN __host__ __device__ __forceinline__
#define INGOT_MATH_LIB(name) ::name
#else
#define INGOT_MATH_FN inline
#define INGOT_MATH_LIB(name) __builtin_##name
#endif

namespace ig_math {

// The library functions the formulas use, for float and double.
#define INGOT_MATH_UNARY_LIB(name)                                                      \
  INGOT_MATH_FN float name(float x) { return INGOT_MATH_LIB(name##f)(x); }             \
  INGOT_MATH_FN double name(double x) { return INGOT_MATH_LIB(name)(x); }
INGOT_MATH_UNARY_LIB(exp)
INGOT_MATH_UNARY_LIB(tanh)
INGOT_MATH_UNARY_LIB(erf)
#undef INGOT_MATH_UNARY_LIB

template <typename T>
INGOT_MATH_FN T relu(T x) {
  return x > T(0) ? x : T(0);
}
template <typename T>
INGOT_MATH_FN T sigmoid(T x) {
  return T(1) / (T(1) + exp(-x));
}
// x * sigmoid(x) with one division (as PyTorch's kernels write it).
template <typename T>
INGOT_MATH_FN T silu(T x) {
  return x / (T(1) + exp(-x));
}
// 0.7978845608028654 = sqrt(2 / pi); 0.7071067811865476 = 1 / sqrt(2); 0.3989422804014327 = 1 / sqrt(2 pi).
template <typename T>
INGOT_MATH_FN T gelu_tanh(T x) {
  return T(0.5) * x * (T(1) + tanh(T(0.7978845608028654) * (x + T(0.044715) * x * x * x)));
}
template <typename T>
INGOT_MATH_FN T gelu_erf(T x) {
  return T(0.5) * x * (T(1) + erf(x * T(0.7071067811865476)));
}

template <typename T>
INGOT_MATH_FN T relu_grad(T x, T dy) {
  return x > T(0) ? dy : T(0);
}
template <typename T>
INGOT_MATH_FN T sigmoid_grad(T y, T dy) {
  return dy * y * (T(1) - y);
}
template <typename T>
INGOT_MATH_FN T tanh_grad(T y, T dy) {
  return dy * (T(1) - y * y);
}
template <typename T>
INGOT_MATH_FN T silu_grad(T x, T dy) {
  const T s = sigmoid(x);
  return dy * (s * (T(1) + x * (T(1) - s)));
}
template <typename T>
INGOT_MATH_FN T gelu_tanh_grad(T x, T dy) {
  const T k = T(0.7978845608028654), c = T(0.044715);
  const T t = tanh(k * (x + c * x * x * x));
  return dy * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3) * c * x * x));
}
template <typename T>
INGOT_MATH_FN T gelu_erf_grad(T x, T dy) {
  return dy * (T(0.5) * (T(1) + erf(x * T(0.7071067811865476))) + x * T(0.3989422804014327) * exp(T(-0.5) * x * x));
}


// Philox4x32-10 (Salmon et al., SC'11): four 32-bit words from a 64-bit key and a 64-bit counter. runtime/rng.h's
// generators draw from it; it lives here because the generated kernels see only this header.
struct Philox4 {
  unsigned int v[4];
};

INGOT_MATH_FN Philox4 philox4x32_10(unsigned long long seed, unsigned long long counter) {
  unsigned int c0 = static_cast<unsigned int>(counter), c1 = static_cast<unsigned int>(counter >> 32), c2 = 0, c3 = 0;
  unsigned int k0 = static_cast<unsigned int>(seed), k1 = static_cast<unsigned int>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const unsigned long long p0 = static_cast<unsigned long long>(0xD2511F53u) * c0;
    const unsigned long long p1 = static_cast<unsigned long long>(0xCD9E8D57u) * c2;
    const unsigned int hi0 = static_cast<unsigned int>(p0 >> 32), lo0 = static_cast<unsigned int>(p0);
    const unsigned int hi1 = static_cast<unsigned int>(p1 >> 32), lo1 = static_cast<unsigned int>(p1);
    const unsigned int n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

INGOT_MATH_FN unsigned int float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  unsigned int b;
  __builtin_memcpy(&b, &x, sizeof b);
  return b;
#endif
}

INGOT_MATH_FN float float_from_bits(unsigned int b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  __builtin_memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// Note [Stochastic rounding]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// bf16 weights updated without f32 masters (train.master_weights: false) lose every update below half an ulp
// when rounded to nearest: at lr 2e-5 AdamW moves a weight by ~2e-5, while a bf16 weight of magnitude 0.02 has an
// ulp of 1.2e-4, so most weights would never move. Rounded stochastically, a value between two bf16 neighbours goes
// up with probability equal to its distance from the lower one over their gap, so the expected stored weight is
// the exact update (Gupta et al. 2015; Zamirai et al. 2020, "Revisiting BFloat16 Training"; torchao's
// bf16_stochastic_round). Adding a uniform 16-bit integer to the f32's low 16 bits and clearing them does that for
// either sign (the bits are a magnitude). Inf and NaN pass unchanged; the result is a bf16 value, which the store's
// round-to-nearest conversion keeps exactly.
//
// The 16 bits: a half of a Philox word counted by `salt` (stochastic_salt: the element's index in its tensor and the
// optimizer step) under a fixed key, XORed with a hash of the value's own bits. The Philox half is uniform and
// independent of the value, so the XOR is uniform given the value (unbiased as above); the hash keeps element j of
// two tensors, whose salts are equal, from rounding with one number. One Philox call (128 bits) serves the eight
// elements whose salts differ in the low three bits only: a kernel holding eight consecutive elements calls
// stochastic_block once (adamw8bit.cu: Philox was a quarter of its instructions), one holding one element calls
// round_bf16_stochastic, and both round alike. All of it is a pure function of what every kernel has at hand:
// eager CPU and CUDA and the generated kernels round alike, bit for bit, and a resumed run rounds as the
// uninterrupted one did (no generator state to save).
INGOT_MATH_FN long long stochastic_salt(long long index, long long step) { return index + step * (1LL << 40); }

// The Philox output of the eight salts salt & ~7 .. salt | 7.
INGOT_MATH_FN Philox4 stochastic_block(long long salt) {
  return philox4x32_10(0x5EEDB16F2545F491ULL, static_cast<unsigned long long>(salt) >> 3);
}
// The Philox half of the salt whose low three bits are k.
INGOT_MATH_FN unsigned int stochastic_bits(const Philox4& r, int k) {
  const unsigned int w = k < 2 ? r.v[0] : k < 4 ? r.v[1] : k < 6 ? r.v[2] : r.v[3];
  return (k & 1) ? w >> 16 : w & 0xFFFFu;
}
// x rounded with the Philox half `bits` (stochastic_bits) of its salt.
INGOT_MATH_FN float round_bf16_with(float x, unsigned int bits) {
  const unsigned int b = float_bits(x);
  if ((b & 0x7F800000u) == 0x7F800000u) return x;
  const unsigned int u = (bits ^ ((b * 0x9E3779B1u) >> 16)) & 0xFFFFu;
  return float_from_bits((b + u) & 0xFFFF0000u);
}
INGOT_MATH_FN float round_bf16_stochastic(float x, long long salt) {
  return round_bf16_with(x, stochastic_bits(stochastic_block(salt), static_cast<int>(salt & 7)));
}

}  // namespace ig_math

#undef INGOT_MATH_LIB
#undef INGOT_MATH_FN

#endif  // INGOT_RUNTIME_KERNELS_SCALAR_MATH_H_
