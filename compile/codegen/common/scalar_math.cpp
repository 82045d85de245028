// The calls of runtime/kernels/scalar_math.h in generated kernels (see scalar_math.h).
#include "compile/codegen/common/scalar_math.h"

#include "runtime/error.h"

namespace ingot::codegen {

std::string scalar_math_call(Op op, const std::string& T, const std::string& args) {
  const char* f = nullptr;
  switch (op) {
    case Op::Sigmoid: f = "sigmoid"; break;
    case Op::Relu: f = "relu"; break;
    case Op::Silu: f = "silu"; break;
    case Op::GeluTanh: f = "gelu_tanh"; break;
    case Op::GeluErf: f = "gelu_erf"; break;
    case Op::ReluGrad: f = "relu_grad"; break;
    case Op::SigmoidGrad: f = "sigmoid_grad"; break;
    case Op::TanhGrad: f = "tanh_grad"; break;
    case Op::SiluGrad: f = "silu_grad"; break;
    case Op::GeluTanhGrad: f = "gelu_tanh_grad"; break;
    case Op::GeluErfGrad: f = "gelu_erf_grad"; break;
    default: INGOT_INTERNAL_CHECK(false, "scalar_math_call: op ", op_name(op), " has no scalar_math.h function");
  }
  return std::string("ig_math::") + f + "<" + T + ">(" + args + ")";
}

}  // namespace ingot::codegen
