#include "optim/mixed_precision.h"

#include "autograd/ops.h"
#include "runtime/allocator_census.h"

namespace ingot::optim {

MasterWeights::MasterWeights(std::vector<Tensor> model_params) : model_(std::move(model_params)) {
  for (size_t i = 0; i < model_.size(); ++i) {
    const Tensor& p = model_[i];
    INGOT_CHECK(p.defined() && is_floating(p.dtype()), "MasterWeights: parameter ", i, " must be a floating tensor");
    // A fresh f32 buffer even when the parameter is already f32: the master must not alias the model.
    const census::Owner owner("f32 masters");
    Tensor m = empty(p.shape(), DType::f32, p.device());
    m.copy_(p);
    m.set_requires_grad(true);
    m.set_name(p.name());
    master_.push_back(m);
  }
}

void MasterWeights::copy_grads_to_master() {
  for (size_t i = 0; i < model_.size(); ++i) master_[i].set_grad(model_[i].grad());
}

void MasterWeights::copy_to_model() {
  NoGradGuard ng;
  TraceObserver* obs = trace_observer();
  for (size_t i = 0; i < model_.size(); ++i) {
    // Note [Shards cast from their masters] (distributed/fsdp.h): a ZeRO-3 shard without bytes is made from its
    // master when it is gathered; there is nothing to round into.
    if (model_[i].numel() > 0 && !model_[i].storage()->data) continue;
    if (!obs) {
      model_[i].copy_(master_[i]);
      continue;
    }
    // Traced (compile/trace/trace.h): the rounding is an op and the copy a write-back, so a replay repeats both.
    Tensor v = cast(master_[i], model_[i].dtype());
    model_[i].copy_(v);
    obs->on_assign(model_[i], v);
  }
}

}  // namespace ingot::optim
