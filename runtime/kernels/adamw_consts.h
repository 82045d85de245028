// The f32 constants of one AdamW update, computed on the host once per call the same way for every AdamW kernel
// (CPU and CUDA, f32 and 8-bit state), so that they round alike.
#pragma once

#include "runtime/kernels/kernels.h"

namespace ingot::kernels {

struct AdamWConsts {
  float lr, b1, b2, one_minus_b1, one_minus_b2, eps, decay, scale, bc1, bc2;
  long long step;  // salts a bf16 parameter's stochastic rounding (Note [Stochastic rounding], scalar_math.h)
};
// `op` names the kernel in the error for a step below 1 (the step is 1-based, for bias correction).
AdamWConsts adamw_consts(const AdamWArgs& args, const char* op);

}  // namespace ingot::kernels
