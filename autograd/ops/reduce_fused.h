// A sum with a wider result, for the compiler's graph rewrites (compile/passes/matmul_epilogue.cpp); models
// never build it directly.
#pragma once

#include <memory>

#include "autograd/primitive.h"

namespace ingot {

// For a sum primitive: the same sum writing f32 (of bf16 / f16 input, accumulated in f32 and rounded once),
// i.e. cast(sum(x), f32) without the bf16 rounding in between. nullptr when `sum` is not a plain sum.
std::shared_ptr<Primitive> widened_sum(const Primitive& sum);

}  // namespace ingot
