// Dynamic loss scaling for fp16 training, the rule of torch.amp.GradScaler. The loss is multiplied by scale()
// before backward so that small gradients stay representable in fp16 (its smallest normal is 6.1e-5); the
// optimizer then takes the gradients times 1 / scale (Optimizer::set_grad_scale). A step whose gradients hold an
// inf or NaN is skipped and the scale shrinks by backoff_factor; after growth_interval finite steps in a row it
// grows by growth_factor.
//
// Step:  const double used = s.scale();  (loss * used).backward();  norm = grad_norm(params) / used;
//        if (s.update(std::isfinite(norm))) { opt.set_grad_scale(1 / used); opt.step(); }
#pragma once

#include <cstdint>

namespace ingot::optim {

struct LossScalerOptions {
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions opts = {});
  double scale() const { return scale_; }
  int64_t growth_tracker() const { return good_steps_; }  // finite steps since the scale last changed
  // Adjusts the scale after a step whose gradients were `finite` or not, and returns `finite`: whether the
  // step is to be applied.
  bool update(bool finite);
  // Continues from a checkpoint's scale and growth tracker.
  void restore(double scale, int64_t growth_tracker);

 private:
  LossScalerOptions opts_;
  double scale_;
  int64_t good_steps_ = 0;
};

}  // namespace ingot::optim
