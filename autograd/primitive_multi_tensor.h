// Note [Multi-tensor updates]: an optimizer's update of n parameters applied as one primitive (optim/
// fused_update.h: AdamW over every parameter of a step in one node). Such a primitive also derives from
// MultiTensorUpdate, which tells the compiler what it needs to split the update and to lower it to one multi-tensor kernel (compile/lower/lower_kernel.cpp), so
// compile/ knows no optimizer: the update, its eager kernels and its kernel IR live with the optimizer.
//
// Inputs: hyper (a host f64 tensor [G, 3], one row per update), then input_slots() lists of tensors() tensors
// each (AdamW: p, g, m, v). Outputs: output_slots() lists (AdamW: p', m', v').
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/primitive.h"
#include "compile/codegen/common/kernel_spec.h"

namespace ingot {

// The update as one KernelSpec of kind MultiTensor: buffer slots are the input slots then the output slots,
// each output aliasing the input it updates (state_slots()). Its run-time scalars are {lr, 1 - lr * weight_decay, grad_scale,
// 1 - beta1^step, 1 - beta2^step, step}, which the executor computes per call from row hyper_row of the hyper
// tensor {lr, step, grad_scale} (compile/exec/kernel_step.cpp).
struct MultiTensorKernel {
  codegen::KernelSpec spec;
  int64_t hyper_row = 0;
  double beta1 = 0, beta2 = 0, weight_decay = 0;
};

// An update of several parameters in one primitive: the fuser puts every one of a step in one MultiTensor group
// (horizontal fusion; compile/lower/lowering.h: is_multi_tensor_update). A MultiTensorUpdate also lowers to one
// kernel; an update that is only a HorizontalUpdate (SGD's) runs its eager kernel from that group.
class HorizontalUpdate {
 public:
  virtual ~HorizontalUpdate() = default;
};

// An update of n tensors per list that the compiler may cut into updates of fewer: per parameter under a memory
// budget (compile/passes/split_update.cpp) or per gradient bucket (bucket_updates.cpp), so each gradient dies once
// its own part ran. Every MultiTensorUpdate is one; AdamW8bit's update (optim/adamw8bit.cpp) is one without being
// a MultiTensorUpdate (it runs its eager kernel, never fused or lowered). Inputs: hyper, input_slots() lists of
// tensors() tensors, then shared_inputs() inputs every part reads whole (AdamW8bit: its two maps).
class SplittableUpdate {
 public:
  virtual ~SplittableUpdate() = default;
  virtual size_t tensors() const = 0;
  virtual size_t input_slots() const = 0;
  virtual size_t output_slots() const = 0;
  virtual size_t shared_inputs() const { return 0; }
  // The same update (same hyper row and fixed arguments) of n tensors per list: what splitting it per
  // parameter (compile/passes/split_update.cpp) or per gradient bucket (bucket_updates.cpp) builds.
  virtual std::shared_ptr<Primitive> for_tensors(size_t n) const = 0;
};

class MultiTensorUpdate : public HorizontalUpdate, public SplittableUpdate {
 public:
  // The kernel for inputs of these dtypes (hyper first), or nullopt with the reason in `why`.
  virtual std::optional<MultiTensorKernel> lower(const std::vector<DType>& input_dtypes, std::string* why) const = 0;
  // Note [Pieces read by the update] (compile/passes/pieces_into_update.h): the same update reading each gradient
  // as `pieces` inputs summed in f32 in their order and scaled by `scale` (autograd/ops/sum_pieces.h's
  // arithmetic), its gradient slot becoming `pieces` slots; nullptr when the update cannot.
  virtual std::shared_ptr<Primitive> with_gradient_pieces(size_t /*pieces*/, double /*scale*/) const { return nullptr; }
  // The input slots the output slots update, in output order (AdamW: p, m, v).
  virtual std::vector<size_t> state_slots() const = 0;
  // Note [Narrow gradients read by the update] (compile/passes/widen_in_update.h): whether input slot 1 (the
  // gradients) may be of any float dtype, widened to f32 as it is loaded exactly as a cast would, in the lowered
  // kernel and the eager ones alike (all of one dtype per update).
  virtual bool widens_gradients() const { return false; }
};

// An update primitive that can also run over its inputs (Note [Traced updates run in place], optim/fused_update.h):
// every optimizer's update. A compiled step whose graph lets each written input be overwritten runs it so too
// (compile/exec/executor.cpp) instead of its functional eval, which copies every parameter and state tensor first
// (32 GB for AdamW8bit's update of an 8B model's bf16 weights and 8-bit moments).
class InPlaceUpdate {
 public:
  virtual ~InPlaceUpdate() = default;
  // The inputs the outputs overwrite, in output order.
  virtual std::vector<Tensor> written(const std::vector<Tensor>& in) const = 0;
  // The update computed over those inputs: what eval returns, in them.
  virtual void update_in_place(const std::vector<Tensor>& in) const = 0;
  // The indices of the inputs written() returns, in output order; empty when the executor should run eval.
  virtual std::vector<size_t> written_inputs() const { return {}; }
};

inline bool is_horizontal_update(const Primitive& p) { return dynamic_cast<const HorizontalUpdate*>(&p) != nullptr; }

inline const MultiTensorUpdate* as_multi_tensor_update(const Primitive& p) {
  return dynamic_cast<const MultiTensorUpdate*>(&p);
}

inline const SplittableUpdate* as_splittable_update(const Primitive& p) {
  return dynamic_cast<const SplittableUpdate*>(&p);
}

}  // namespace ingot
