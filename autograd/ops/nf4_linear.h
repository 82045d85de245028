// A projection whose frozen weight is stored in NF4 (runtime/kernels/nf4.h): QLoRA's base layers.
#pragma once

#include "autograd/primitive.h"
#include "runtime/kernels/nf4.h"

namespace ingot {

// y = x @ W^T for x [..., in] (f32, bf16 or f16) and an NF4 weight W [out, in] on x's device; y has x's dtype.
// Each call dequantizes W into a scratch buffer of x's dtype just before the product and frees it after, so
// the dense weight exists for one projection at a time. Differentiable in x only (W is frozen): the backward
// is dx = dy @ W, dequantized again, and x itself is not saved for it (no weight gradient needs it). Eager: a
// traced step records it as an opaque op that runs this same evaluation.
Tensor nf4_linear(const Tensor& x, const Nf4Tensor& w);

}  // namespace ingot
