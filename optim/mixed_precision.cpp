#include "optim/mixed_precision.h"

namespace ingot::optim {

MasterWeights::MasterWeights(std::vector<Tensor> model_params) : model_(std::move(model_params)) {
  for (size_t i = 0; i < model_.size(); ++i) {
    const Tensor& p = model_[i];
    INGOT_CHECK(p.defined() && is_floating(p.dtype()), "MasterWeights: parameter ", i, " must be a floating tensor");
    // A fresh f32 buffer even when the parameter is already f32: the master must not alias the model.
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
  for (size_t i = 0; i < model_.size(); ++i) model_[i].copy_(master_[i]);
}

}  // namespace ingot::optim
