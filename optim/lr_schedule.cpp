#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "runtime/error.h"

namespace ingot::optim {

double LrSchedule::at(int64_t step) const {
  INGOT_CHECK(step >= 0, "LrSchedule: step must be >= 0, got ", step);
  if (step < warmup_steps) return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == Kind::Constant) return base_lr;
  const int64_t decay_steps = total_steps - warmup_steps;
  const double p =
      decay_steps <= 0 ? 1.0 : std::clamp(static_cast<double>(step - warmup_steps) / decay_steps, 0.0, 1.0);
  if (kind == Kind::Cosine) return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
  return base_lr + (min_lr - base_lr) * p;
}

LrSchedule::Kind LrSchedule::parse_kind(std::string_view s) {
  if (s == "constant") return Kind::Constant;
  if (s == "cosine") return Kind::Cosine;
  if (s == "linear") return Kind::Linear;
  INGOT_FAIL("lr schedule: unknown kind '", s, "' (expected constant, cosine or linear)");
}

}  // namespace ingot::optim
