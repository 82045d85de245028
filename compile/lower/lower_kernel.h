// Lowering fused groups (compile/passes/fuse.cpp) to the codegen's KernelSpec (compile/codegen/common/kernel_spec.h),
// and the run-time glue that calls the compiled kernel from the executor.
//
// This file knows no op: each op appends its own expression (Note [Ops lower themselves],
// autograd/kernel_lowering.h: the pointwise, reduction and normalization families of autograd/ops/). What is
// decided here is the iteration space and the buffers:
//   Pointwise groups     the outputs' shape, one loop dim per axis (merged runs of adjacent axes).
//   RowReduction groups  the reducing op's input shape, its reduced axes (reduced_axes()) merged into the last
//                        dim, so a reduction over leading axes (a norm's dw / db) reads its input transposed;
//                        pointwise prologues and epilogues around it.
//   MultiTensor groups   an optimizer's multi-tensor update over every parameter in one kernel, built by the
//                        update's primitive (Note [Multi-tensor updates], autograd/primitive_multi_tensor.h);
//                        its learning rate, step-derived bias corrections and grad scale are run-time scalars;
//                        and the casts of f32 parameters to bf16 in one kernel (Note [Parameter casts]).
// A group holding an op that does not lower itself is not lowered: its nodes run one by one through the eager
// kernels.
// Buffers are dense row-major at run time (the glue makes strided inputs contiguous); broadcast inputs get
// stride 0. Kernel dims are the traced sizes (a new size of a dynamic dim re-traces; the kernel cache is keyed
// by structure, so repeated shapes never compile twice).
#pragma once

#include <optional>
#include <string>

#include "compile/codegen/common/kernel_spec.h"
#include "compile/ir/graph.h"

namespace ingot::compiler {

struct LoweredGroup {
  codegen::KernelSpec spec;
  std::vector<int32_t> inputs;   // graph value per input buffer (spec input order; MultiTensor: per slot & tensor)
  std::vector<int32_t> outputs;  // graph value per output buffer
  // MultiTensor (AdamW): the hyper input value and row the scalars come from, the fixed arguments, and the
  // number of tensors; buffer slots are the update's input slots (p, g, m, v; or p, g's pieces, m, v) then its
  // output slots (p', m', v'), each aliasing the input slot state_slots names.
  int32_t hyper_value = -1;
  int64_t hyper_row = 0;
  double beta1 = 0, beta2 = 0, weight_decay = 0;
  size_t tensors = 0;
  std::vector<size_t> state_slots;
};

// The KernelSpec for group `fg`, or nullopt with the reason in `why` (an op with no kernel lowering).
std::optional<LoweredGroup> lower_group(const Graph& g, const FusionGroup& fg, std::string* why = nullptr);

}  // namespace ingot::compiler
