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

}  // namespace ig_math

#undef INGOT_MATH_LIB
#undef INGOT_MATH_FN

#endif  // INGOT_RUNTIME_KERNELS_SCALAR_MATH_H_
