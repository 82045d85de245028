// Learning-rate schedules: linear warm-up, then constant, cosine or linear decay to min_lr.
#pragma once

#include <cstdint>
#include <string_view>

namespace ingot::optim {

struct LrSchedule {
  enum class Kind { Constant, Cosine, Linear };
  Kind kind = Kind::Constant;
  double base_lr = 1e-3, min_lr = 0;
  int64_t warmup_steps = 0, total_steps = 0;

  // The lr for optimizer step `step` (0-based, the step about to run):
  //   step < warmup_steps:  base_lr * (step + 1) / warmup_steps
  //   then, with p = (step - warmup_steps) / (total_steps - warmup_steps) clamped to [0, 1]:
  //   Constant: base_lr; Cosine: min_lr + (base_lr - min_lr) * (1 + cos(pi p)) / 2;
  //   Linear: base_lr + (min_lr - base_lr) * p.
  double at(int64_t step) const;

  // "constant", "cosine", "linear"; throws listing the choices otherwise.
  static Kind parse_kind(std::string_view s);
};

}  // namespace ingot::optim
