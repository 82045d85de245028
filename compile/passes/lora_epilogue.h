// A LoRA branch's scale and sum folded into its matrix product. Invariant afterwards: no add reads, through
// reshapes and mul_scalars that nothing else reads, a 2-D matmul or bias-free linear that nothing else reads and
// whose left operand is a scaled activation (a mul_scalar through reshapes: LoRA's s * A(x) and s * (dy @ B)),
// together with a value of the add's shape, with the add, the product and the value all of one dtype; each such
// chain is one matmul_scaled node (autograd/ops/matmul_fused.h) with alpha = the scalars' product accumulating
// into that value. And no mul_scalar reads such a product (through reshapes): the pair is one matmul_scaled with
// alpha = the scalar.
// Test: tests/compile/passes/test_lora_epilogue.cpp (GPU: tests/gpu/test_cuda_lora_epilogue.cpp).
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct LoraEpilogueOptions {
  Device target = Device::cpu();
};

bool lora_epilogue(Graph& g, const LoraEpilogueOptions& o);

}  // namespace ingot::compiler::passes
