// Matrix products fused with the pointwise work around them, for the compiler's graph rewrites
// (compile/passes/matmul_epilogue.cpp, accumulate_products.cpp, scale_into_products.cpp); models never build these
// directly.
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

// inputs:  a, b (as for matmul with the given trans flags), c (as many elements as the product, its dtype)
// outputs: alpha * op(a) @ op(b) + c, shaped like c: the product accumulated into c's buffer (the kernel's beta = 1)
//          when nothing else holds it (Note [Outputs over dead inputs]). Never differentiated.
std::shared_ptr<Primitive> make_matmul_accumulate(bool trans_a, bool trans_b, double alpha);

struct MatmulFlags {
  bool trans_a = false, trans_b = false;
  bool widened = false;  // make_matmul_widened's f32 result
  double alpha = 1.0;    // the product's scale (scaled_product)
};
// The attributes of a matmul primitive (widened or not), or nullopt when `p` is not one.
std::optional<MatmulFlags> matmul_flags(const Primitive& p);
// Whether `p` is linear's primitive (x [M, K], w [N, K], optional b [N]; autograd/ops.h: linear).
bool is_linear(const Primitive& p);

// The scale alpha of a product that has one (matmul, linear, matmul_accumulate: 1 unless a scale was folded in),
// or nullopt when `p` is none of them.
std::optional<double> product_alpha(const Primitive& p);
// The same product with its alpha multiplied by `s`: op(a) @ op(b) scaled, never a linear's bias (a linear with a
// bias and alpha != 1 is refused when it runs: the bias kernel takes no alpha). Such a product has no vjp (it only
// appears in graphs the compiler rewrote: compile/passes/scale_into_products.cpp). nullptr when `p` is no product
// of product_alpha's.
std::shared_ptr<Primitive> scaled_product(const Primitive& p, double s);

}  // namespace ingot
