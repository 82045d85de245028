// Mixed precision: the model holds 16-bit (bf16) parameters for compute; the optimizer updates fp32 master
// copies, which are then rounded back into the model. Norm statistics, softmax and the loss run in f32
// inside the ops whatever the parameter dtype.
//
// Step:  loss.backward();  mw.copy_grads_to_master();  opt.step();  mw.copy_to_model();  model.zero_grad();
// with the optimizer built over mw.master().
#pragma once

#include <vector>

#include "autograd/nn/module.h"

namespace ingot::optim {

using nn::maybe_cast;

class MasterWeights {
 public:
  // `model_params` are leaves of any floating dtype; masters are f32 copies (leaves with requires_grad).
  explicit MasterWeights(std::vector<Tensor> model_params);
  const std::vector<Tensor>& master() const { return master_; }
  const std::vector<Tensor>& model() const { return model_; }
  // Points each master's .grad at its model parameter's .grad (no copy: the optimizer kernels read any
  // float grad dtype); a model parameter without a gradient leaves its master without one.
  void copy_grads_to_master();
  // Rounds the masters into the model parameters (in place; the model's handles stay valid). Parameters without
  // bytes are skipped: ZeRO-3 shards gathered from their masters (Note [Shards cast from their masters], fsdp.h).
  void copy_to_model();

 private:
  std::vector<Tensor> model_, master_;
};

}  // namespace ingot::optim
