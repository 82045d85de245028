// Pieces of a chunk summed in a wider dtype, in order: the sum half of Note [Narrow wire, wide sum]
// (distributed/process_group.h) as a graph op. Compiled ZeRO-3 with a narrow wire exchanges the bf16 chunks
// (distributed/collective_ops.h: exchange_unit_start) and sums the world's pieces here, so that the compiler can
// fold the sum into the optimizer update that reads it (compile/passes/pieces_into_update.h): the update then
// reads the bf16 pieces instead of an f32 gradient written and read once more.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "autograd/primitive.h"
#include "compile/codegen/common/kernel_spec.h"

namespace ingot {

// out[i] = (pieces[0][i] + pieces[1][i] + ... ) * scale, accumulated in `into` (f32 or f64) in the pieces' order,
// then rounded once: the same bits on CPU and CUDA (kernels' sum_pieces). The pieces: 1-d, one floating dtype, one
// length. Not differentiable (it sums gradients for an update).
Tensor sum_pieces(const std::vector<Tensor>& pieces, double scale, DType into);

// What a sum_pieces primitive sums: its number of pieces (its inputs), the scale and the dtype it sums in.
struct SumPiecesInfo {
  size_t pieces = 0;
  double scale = 1.0;
  DType into = DType::f32;
};
std::optional<SumPiecesInfo> as_sum_pieces(const Primitive& p);

// The sum's expression in a generated kernel, over nodes already holding the pieces' values: each cast to `into`,
// added in order, times `scale` rounded to `into`. The one arithmetic of sum_pieces' own lowering and of an
// update reading the pieces (Note [Pieces read by the update]), so the two give the same bits.
int sum_pieces_expr(codegen::KernelSpec& k, const std::vector<int>& pieces, double scale, DType into);

}  // namespace ingot
