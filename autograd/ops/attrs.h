// Typed attributes of the ops whose attributes the compiler reads (Note [Typed attributes],
// autograd/primitive.h): `if (const CastAttrs* c = match<CastAttrs>(*node.prim); c && c->to == DType::f32)`.
// Each struct is what its primitive holds; the family file that defines the primitive is the only writer.
// The attributes of the fused ops of the compiler's rewrites sit with their makers (norm.h NormBwdFlags,
// matmul_fused.h MatmulFlags, loss_fused.h CrossEntropyAttrs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/shape.h"
#include "runtime/kernels/kernels.h"

namespace ingot {

// The unary ops that take a scalar operand (alpha): pow_scalar, add_scalar, mul_scalar, rsub_scalar, rdiv_scalar.
inline bool takes_scalar(kernels::UnaryOp op) {
  using kernels::UnaryOp;
  return op == UnaryOp::PowScalar || op == UnaryOp::AddScalar || op == UnaryOp::MulScalar ||
         op == UnaryOp::RSubScalar || op == UnaryOp::RDivScalar;
}

// pointwise.cpp: every unary op (neg ... logical_not); alpha is the scalar of takes_scalar(op) ops, else 0.
struct UnaryAttrs {
  kernels::UnaryOp op;
  double alpha = 0.0;
};
// pointwise.cpp: every binary op, the activation-gradient helpers included.
struct BinaryAttrs {
  kernels::BinaryOp op;
};
// pointwise.cpp: cast.
struct CastAttrs {
  DType to;
};
// reduce.cpp: sum, mean, amax, amin, argmax, argmin, logsumexp. dims are wrapped, sorted and unique (all dims
// when the user named none); widened: a sum writing f32 of a bf16 / f16 input (reduce_fused.h).
struct ReduceAttrs {
  kernels::ReduceOp op;
  std::vector<int64_t> dims;
  bool keepdim = false;
  bool widened = false;
};
// shape.cpp: permute (dims wrapped: output dim i is input dim dims[i]) and cat (dim wrapped).
struct PermuteAttrs {
  std::vector<int64_t> dims;
};
struct CatAttrs {
  int64_t dim;
};
// shape.cpp: reshape and expand, each to `shape` (the output's shape).
struct ReshapeAttrs {
  Shape shape;
};
struct ExpandAttrs {
  Shape shape;
};
// pointwise.cpp clone and shape.cpp contiguous: a dense copy of the input. Nothing to hold; what the compiler
// matches (a copy passes a value through unchanged) is the struct itself.
struct CopyAttrs {};
// norm.cpp: layer_norm (centered) and rms_norm; weight / bias: whether the op was given them.
struct NormAttrs {
  bool centered;
  double eps;
  bool weight, bias;
};
// attention.cpp: attention_bwd (dq, dk, dv of scaled dot-product attention; attention_packed.h packs them).
// The packed op (attention_bwd_packed) does not hold it: it is a different op, not a backward to pack.
struct AttentionBwdAttrs {
  bool causal;
  double scale;
};
// distributed/collective_ops.cpp: all_gather_unit_start (an FSDP unit's weights gathered) and
// reduce_scatter_unit_start (its gradients reduced) of compiled ZeRO-3. unit: the unit's index in
// FullyShardedDataParallel::layout() order; name: its module path ("root", "transformer.h.3"). regather: the
// backward reads a gather of its own instead of keeping the forward's (reshard_after_forward;
// compile/passes/unit_gathers.cpp).
struct UnitCollectiveAttrs {
  int32_t unit = -1;
  std::string name;
  bool regather = false;
};
// distributed/collective_ops.cpp: what a collective outside the units' and buckets' is for ("the token ids of
// every rank", Note [Vocabulary-parallel embeddings]), for explain to say; the same text on every rank.
struct CollectivePurposeAttrs {
  std::string what;
};

}  // namespace ingot
