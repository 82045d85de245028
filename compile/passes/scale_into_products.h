// A scalar multiply whose result only products read becomes those products' alpha.
// Invariant afterwards, for values on a CUDA target (or on any device with cpu_too): no mul_scalar of a floating value
// into its own dtype has a result that, seen through views, is read only as operand a or b of products (matmul,
// bias-free linear, matmul_accumulate) and is no graph output, write-back, gradient or bucket placement; each such
// multiply is gone, its readers' views read its input, and each product's alpha is multiplied by the scalar once per
// operand it read from the scaled value. Test: tests/compile/passes/test_scale_into_products.cpp.
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct ScaleIntoProductsOptions {
  Device target = Device::cpu();
  bool cpu_too = false;  // rewrite CPU values too (the scaled products run on the CPU; the tests use it)
};

bool scale_into_products(Graph& g, const ScaleIntoProductsOptions& o);

}  // namespace ingot::compiler::passes
