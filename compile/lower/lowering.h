// What the passes ask of ops: which ops fuse horizontally, where the scheduler places them, which are layout glue,
// which are identities. Read from what an op declares, never its name: its typed attributes (Note [Typed
// attributes]; clone and contiguous declare CopyAttrs, reshape and expand their shape), a collective's phase
// (autograd/primitive_collective.h), an optimizer's HorizontalUpdate (autograd/primitive_multi_tensor.h). How an
// op maps to a kernel expression is the op's own (Note [Ops lower themselves], autograd/kernel_lowering.h).
#pragma once

#include <optional>
#include <string>

#include "autograd/primitive.h"

namespace ingot::compiler {

// The optimizer's multi-tensor update (autograd/primitive_multi_tensor.h): one group of all of them (horizontal
// fusion), unless split_update or split_update_by_bucket made one per parameter or per gradient bucket.
bool is_multi_tensor_update(const Primitive& p);
// Where the scheduler wants `p` among the nodes ready to run: -1 as early as possible (a collective's start,
// so communication overlaps the compute after it), +1 as late as possible (the wait for a collective), 0 in
// trace order (everything else).
int schedule_class(const Primitive& p);
// Ops that only move, re-describe or convert data (views, cat, cast: a bucket's flatten, concatenation and
// reduce_dtype conversion): what may be hoisted with a collective's start.
bool is_layout_glue(const Primitive& p);

}  // namespace ingot::compiler

namespace ingot::compiler {
// When `p` returns input k unchanged (clone, mul_scalar by 1, add_scalar 0, pow_scalar 1, a reshape to the
// input's own shape): k, else nullopt. `in`/`out` are the node's metadata (same dtype and shape required).
std::optional<size_t> identity_input(const Primitive& p, const std::vector<TensorMeta>& in,
                                     const std::vector<TensorMeta>& out);
// The scalar of a unary op with one (mul_scalar, add_scalar, pow_scalar, rsub_scalar, rdiv_scalar), read from
// its typed attributes (autograd/ops/attrs.h); nullopt for other ops.
std::optional<double> scalar_alpha(const Primitive& p);
}  // namespace ingot::compiler
