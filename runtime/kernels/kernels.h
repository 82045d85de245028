// Eager kernels for each backend, declared from one list (kernel_list.inc) so CPU and CUDA stay in step.
//   kernels::cpu::binary(...)    runtime/kernels/cpu/*.cpp
//   kernels::cuda::binary(...)   runtime/kernels/cuda/*.cu, or runtime/no_cuda.cpp (throws) without CUDA
// Ops call INGOT_KERNEL_CALL(device, name, args...) to pick the backend.
#pragma once

#include <vector>

#include "runtime/tensor.h"

namespace ingot::kernels {

enum class UnaryOp {
  Neg, Exp, Log, Sqrt, Rsqrt, Abs, Tanh, Sigmoid, Relu, GeluTanh, GeluErf, Silu, Sin, Cos, Reciprocal,
  Square, Sign, PowScalar, AddScalar, MulScalar, RSubScalar, RDivScalar, Log1p, Expm1, Floor, LogicalNot,
};
enum class BinaryOp {
  Add, Sub, Mul, Div, Pow, Maximum, Minimum,
  Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr,
  // Backward helpers: out = dy * f'(x), called as binary(op, out, x, dy).
  GeluTanhGrad, GeluErfGrad, SiluGrad, SigmoidGradFromOutput, TanhGradFromOutput, ReluGrad,
};
enum class ReduceOp { Sum, Mean, Max, Min, ArgMax, ArgMin, LogSumExp, Prod };

const char* unary_name(UnaryOp op);
const char* binary_name(BinaryOp op);
const char* reduce_name(ReduceOp op);
inline bool is_comparison(BinaryOp op) {
  return op == BinaryOp::Eq || op == BinaryOp::Ne || op == BinaryOp::Lt || op == BinaryOp::Le ||
         op == BinaryOp::Gt || op == BinaryOp::Ge || op == BinaryOp::LogicalAnd || op == BinaryOp::LogicalOr;
}

struct AdamWArgs {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;          // 1-based, for bias correction
  double grad_scale = 1.0;   // grads are multiplied by this first (clipping, loss-scale unscaling)
};
struct SgdArgs {
  double lr = 1e-2, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = true;    // momentum buffer starts as the gradient
  double grad_scale = 1.0;
};

#define INGOT_KERNEL(name, params) void name params;
namespace cpu {
#include "runtime/kernels/kernel_list.inc"
}
namespace cuda {
#include "runtime/kernels/kernel_list.inc"
}
#undef INGOT_KERNEL

}  // namespace ingot::kernels

#define INGOT_KERNEL_CALL(device, name, ...)                                              \
  ((device).is_cuda() ? ::ingot::kernels::cuda::name(__VA_ARGS__)                        \
                      : ::ingot::kernels::cpu::name(__VA_ARGS__))
