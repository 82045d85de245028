#include "autograd/primitive.h"
#include "optim/fused_update.h"
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
  if (trace_observer()) return traced_step();
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

// As step(), with the host bookkeeping (grad scale, whether a momentum buffer is new) re-done by `advance`
// before every replay of the traced graph: see optim/fused_update.h.
void SGD::traced_step() {
  TraceObserver* obs = trace_observer();
  const bool use_momentum = opts_.momentum != 0.0;
  std::vector<std::vector<size_t>> groups(2);
  for (size_t i : params_with_grad()) groups[use_momentum && !has_state(i, "momentum_buffer")].push_back(i);
  std::erase_if(groups, [](const std::vector<size_t>& g) { return g.empty(); });
  auto advance = [this, groups, use_momentum]() {
    const double scale = begin_step();
    Tensor hyper = empty({static_cast<int64_t>(groups.size()), 3}, DType::f64);
    double* h = hyper.data<double>();
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      h[gi * 3] = lr_;
      h[gi * 3 + 1] = scale;
      h[gi * 3 + 2] = use_momentum && !has_state(groups[gi][0], "momentum_buffer") ? 1.0 : 0.0;
    }
    return hyper;
  };
  Tensor hyper = advance();
  obs->on_host_input(hyper, advance);
  kernels::SgdArgs fixed;
  fixed.momentum = opts_.momentum;
  fixed.dampening = opts_.dampening;
  fixed.weight_decay = opts_.weight_decay;
  fixed.nesterov = opts_.nesterov;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const size_t n = groups[gi].size();
    std::vector<Tensor> in{hyper};
    for (size_t i : groups[gi]) in.push_back(params_[i]);
    for (size_t i : groups[gi]) in.push_back(params_[i].grad());
    for (size_t i : groups[gi]) in.push_back(use_momentum ? state(i, "momentum_buffer") : Tensor());
    apply_traced_update(make_sgd_update(n, static_cast<int64_t>(gi), fixed), in);
  }
}

}  // namespace ingot::optim
