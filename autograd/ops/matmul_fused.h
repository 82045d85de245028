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

struct MatmulFlags {
  bool trans_a = false, trans_b = false;
};
// The trans flags of a matmul primitive, or nullopt when `p` is not one.
std::optional<MatmulFlags> matmul_flags(const Primitive& p);

}  // namespace ingot
