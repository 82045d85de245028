// A product added to another product's output accumulates into that output (cuBLASLt's beta = 1).
// Invariant afterwards, for values on a CUDA target (or on any device with cpu_too): no add that broadcasts
// nothing and whose output's readers, seen through views, are all opaque ops or graph outputs reads two product
// outputs (matmul, linear, matmul_accumulate; directly or through reshapes, each read only there) of its own dtype
// where one of them is a plain matmul or a bias-free linear: each such add became one matmul_accumulate node
// (autograd/ops/matmul_fused.h) computing the later of those products into the other's output, and the product
// and its reshapes are gone. Test: tests/compile/passes/test_accumulate_products.cpp.
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct AccumulateProductsOptions {
  Device target = Device::cpu();
  bool cpu_too = false;  // rewrite CPU values too (matmul_accumulate runs on the CPU; the tests use it)
};

bool accumulate_products(Graph& g, const AccumulateProductsOptions& o);

}  // namespace ingot::compiler::passes
