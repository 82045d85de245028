#include "runtime/kernels/kernels.h"

namespace ingot::kernels {

const char* unary_name(UnaryOp op) {
  static const char* names[] = {"neg", "exp", "log", "sqrt", "rsqrt", "abs", "tanh", "sigmoid", "relu",
                                "gelu_tanh", "gelu_erf", "silu", "sin", "cos", "reciprocal", "square", "sign",
                                "pow_scalar", "add_scalar", "mul_scalar", "rsub_scalar", "rdiv_scalar", "log1p",
                                "expm1", "floor", "logical_not"};
  return names[static_cast<int>(op)];
}

const char* binary_name(BinaryOp op) {
  static const char* names[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt",
                                "le", "gt", "ge", "logical_and", "logical_or", "gelu_tanh_grad",
                                "gelu_erf_grad", "silu_grad", "sigmoid_grad", "tanh_grad", "relu_grad"};
  return names[static_cast<int>(op)];
}

const char* reduce_name(ReduceOp op) {
  static const char* names[] = {"sum", "mean", "max", "min", "argmax", "argmin", "logsumexp", "prod"};
  return names[static_cast<int>(op)];
}

}  // namespace ingot::kernels
