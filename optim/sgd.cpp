#include "optim/optimizer.h"
#include "runtime/kernels/kernels.h"

namespace ingot::optim {

SGD::SGD(std::vector<Tensor> params, SGDOptions opts) : Optimizer(std::move(params), opts.lr), opts_(opts) {
  INGOT_CHECK(!opts.nesterov || (opts.momentum > 0 && opts.dampening == 0),
              "SGD: nesterov momentum requires momentum > 0 and dampening == 0");
  for (size_t i = 0; i < params_.size(); ++i)
    INGOT_CHECK(params_[i].dtype() == DType::f32, "SGD: parameter ", i, " ('", params_[i].name(), "') is ",
                dtype_name(params_[i].dtype()), "; the update runs on f32 parameters");
}

void SGD::step() {
  const double scale = begin_step();
  const bool use_momentum = opts_.momentum != 0.0;
  // A parameter's momentum buffer starts as its first gradient, so new buffers form their own launch.
  std::vector<size_t> groups[2];  // [0]: buffer exists, [1]: first step with momentum
  for (size_t i : params_with_grad()) groups[use_momentum && !has_state(i, "momentum_buffer")].push_back(i);
  for (int first = 0; first < 2; ++first) {
    if (groups[first].empty()) continue;
    std::vector<Tensor> p, g, buf;
    for (size_t i : groups[first]) {
      p.push_back(params_[i]);
      g.push_back(params_[i].grad());
      buf.push_back(use_momentum ? state(i, "momentum_buffer") : Tensor());
    }
    kernels::SgdArgs args;
    args.lr = lr_;
    args.momentum = opts_.momentum;
    args.dampening = opts_.dampening;
    args.weight_decay = opts_.weight_decay;
    args.nesterov = opts_.nesterov;
    args.first_step = first == 1;
    args.grad_scale = scale;
    INGOT_KERNEL_CALL(p[0].device(), sgd_multi, p, g, buf, args);
    for (size_t k = 0; k < p.size(); ++k) {
      p[k].bump_version();
      if (buf[k].defined()) buf[k].bump_version();
    }
  }
}

}  // namespace ingot::optim
