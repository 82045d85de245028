// Matrix products fused with the pointwise work around them, for the compiler's graph rewrites
// (compile/passes/matmul_epilogue.cpp); models never build these directly.
#pragma once

#include <memory>
#include <optional>

#include "autograd/primitive.h"

namespace ingot {

// inputs:  a, b (2-D, as for matmul with the given trans flags), pre (the GELU's input, M * N elements)
// outputs: out = gelu_tanh'(pre) * (op(a) @ op(b)), shaped like pre; with dbias, also dbias [N] = the sum of out
//          over its rows (the bias gradient of the linear that produced pre). One kernel: matmul_dgelu.
std::shared_ptr<Primitive> make_matmul_dgelu(bool trans_a, bool trans_b, bool with_dbias);

// inputs:  x [M, K], w [N, K], b [N], as for linear
// outputs: gelu_tanh(x @ w^T + b) shaped `shape` (M * N elements), and x @ w^T + b [M, N] (what the backward's
//          GELU gradient reads). One kernel: matmul_bias_gelu.
std::shared_ptr<Primitive> make_linear_gelu(Shape shape);

// matmul(a, b) with the trans flags, bf16 / f16 operands and an f32 result that was never rounded to the
// operands' dtype: cast(matmul(a, b), f32) in one product (the weight gradients that AdamW reads in f32).
std::shared_ptr<Primitive> make_matmul_widened(bool trans_a, bool trans_b);

struct MatmulFlags {
  bool trans_a = false, trans_b = false;
};
// The trans flags of a matmul primitive, or nullopt when `p` is not one.
std::optional<MatmulFlags> matmul_flags(const Primitive& p);
// Whether `p` is linear's primitive (x [M, K], w [N, K], optional b [N]; autograd/ops.h: linear).
bool is_linear(const Primitive& p);

}  // namespace ingot
