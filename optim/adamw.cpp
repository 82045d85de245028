#include <map>

#include "autograd/primitive.h"
#include "optim/fused_update.h"
#include "optim/optimizer.h"
#include "runtime/kernels/kernels.h"

namespace ingot::optim {

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions opts) : Optimizer(std::move(params), opts.lr), opts_(opts) {
  for (size_t i = 0; i < params_.size(); ++i)
    INGOT_CHECK(params_[i].dtype() == DType::f32 || params_[i].dtype() == DType::bf16, "AdamW: parameter ", i, " ('",
                params_[i].name(), "') is ", dtype_name(params_[i].dtype()),
                "; the update runs on f32 parameters (for 16-bit models keep f32 master weights, "
                "optim/mixed_precision.h), or on bf16 ones rounded stochastically (Note [Stochastic rounding], "
                "runtime/kernels/scalar_math.h)");
}

void AdamW::step() {
  if (trace_observer()) return traced_step();
  const double scale = begin_step();
  const std::map<int64_t, std::vector<size_t>> groups = advance_step_groups();
  for (auto& [t, idx] : groups) {
    std::vector<Tensor> p, g, m, v;
    for (size_t i : idx) {
      p.push_back(params_[i]);
      g.push_back(params_[i].grad());
      m.push_back(state(i, "exp_avg"));
      v.push_back(state(i, "exp_avg_sq"));
    }
    kernels::AdamWArgs args = adamw_args(opts_);
    args.lr = lr_;
    args.step = t;
    args.grad_scale = scale;
    INGOT_KERNEL_CALL(p[0].device(), adamw_multi, p, g, m, v, args);
    for (size_t k = 0; k < p.size(); ++k) {
      p[k].bump_version();
      m[k].bump_version();
      v[k].bump_version();
    }
  }
}

// The same grouping and host bookkeeping as step(), recorded so that a replay of the traced graph repeats it
// (Optimizer::traced_step_groups; optim/fused_update.h).
void AdamW::traced_step() {
  const auto [groups, hyper] = traced_step_groups();
  const kernels::AdamWArgs fixed = adamw_args(opts_);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const size_t n = groups[gi].size();
    std::vector<Tensor> in{hyper}, dst;
    for (size_t i : groups[gi]) in.push_back(params_[i]);
    for (size_t i : groups[gi]) in.push_back(params_[i].grad());
    for (size_t i : groups[gi]) in.push_back(state(i, "exp_avg"));
    for (size_t i : groups[gi]) in.push_back(state(i, "exp_avg_sq"));
    apply_traced_update(make_adamw_update(n, static_cast<int64_t>(gi), fixed), in);
  }
}

}  // namespace ingot::optim
