#include <cmath>

#include "runtime/error.h"
#include "runtime/kernels/adamw_consts.h"

namespace ingot::kernels {

AdamWConsts adamw_consts(const AdamWArgs& args, const char* op) {
  INGOT_CHECK(args.step >= 1, op, ": step is 1-based, got ", args.step);
  AdamWConsts c;
  c.lr = static_cast<float>(args.lr);
  c.b1 = static_cast<float>(args.beta1);
  c.b2 = static_cast<float>(args.beta2);
  c.one_minus_b1 = 1.0f - c.b1;
  c.one_minus_b2 = 1.0f - c.b2;
  c.eps = static_cast<float>(args.eps);
  c.decay = static_cast<float>(1.0 - args.lr * args.weight_decay);
  c.scale = static_cast<float>(args.grad_scale);
  c.bc1 = static_cast<float>(1.0 - std::pow(args.beta1, static_cast<double>(args.step)));
  c.bc2 = static_cast<float>(1.0 - std::pow(args.beta2, static_cast<double>(args.step)));
  c.step = args.step;
  return c;
}

}  // namespace ingot::kernels
