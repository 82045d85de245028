#include "optim/loss_scaler.h"

#include <cmath>

#include "runtime/error.h"

namespace ingot::optim {

LossScaler::LossScaler(LossScalerOptions opts) : opts_(opts), scale_(opts.init_scale) {
  INGOT_CHECK(opts.init_scale > 0 && opts.growth_factor > 1 && opts.backoff_factor > 0 && opts.backoff_factor < 1 &&
                  opts.growth_interval >= 1,
              "LossScaler: expected init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and growth_interval "
              ">= 1, got ",
              opts.init_scale, ", ", opts.growth_factor, ", ", opts.backoff_factor, ", ", opts.growth_interval);
}

bool LossScaler::update(bool finite) {
  if (!finite) {
    scale_ *= opts_.backoff_factor;
    good_steps_ = 0;
    return false;
  }
  if (++good_steps_ == opts_.growth_interval) {
    scale_ *= opts_.growth_factor;
    good_steps_ = 0;
  }
  return true;
}

void LossScaler::restore(double scale, int64_t growth_tracker) {
  INGOT_CHECK(scale > 0 && std::isfinite(scale) && growth_tracker >= 0, "LossScaler: cannot restore scale ", scale,
              " with growth tracker ", growth_tracker);
  scale_ = scale;
  good_steps_ = growth_tracker;
}

}  // namespace ingot::optim
