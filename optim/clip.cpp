#include "optim/clip.h"

#include <algorithm>
#include <cmath>

#include "autograd/ops.h"
#include "runtime/kernels/kernels.h"

namespace ingot::optim {

double grad_norm(const std::vector<Tensor>& params) {
  NoGradGuard ng;
  // Per-tensor sums of squares stay on the device and are added there: one host sync for the whole norm.
  Tensor total;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor s = sum(square(cast(g, g.dtype() == DType::f64 ? DType::f64 : DType::f32)));
    total = total.defined() ? add(total, s) : s;
  }
  return total.defined() ? std::sqrt(total.item()) : 0.0;
}

double clip_coefficient(double total_norm, double max_norm) {
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  INGOT_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, got ", max_norm);
  const double norm = grad_norm(params);
  const double coef = clip_coefficient(norm, max_norm);
  if (coef >= 1.0) return norm;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    INGOT_KERNEL_CALL(g.device(), unary, kernels::UnaryOp::MulScalar, g, g, coef);
    g.bump_version();
  }
  return norm;
}

Tensor clip_grad_norm_tensor(const std::vector<Tensor>& params, double max_norm,
                             const std::function<Tensor(const Tensor&)>& combine) {
  INGOT_CHECK(max_norm > 0, "clip_grad_norm_tensor: max_norm must be positive, got ", max_norm);
  NoGradGuard ng;
  Tensor total;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor s = sum(square(cast(g, g.dtype() == DType::f64 ? DType::f64 : DType::f32)));
    total = total.defined() ? add(total, s) : s;
  }
  if (!total.defined()) total = zeros({});
  if (combine) total = combine(total);
  Tensor norm = sqrt(total);
  Tensor coef = minimum(rdiv(add(norm, 1e-6), max_norm), ones({}, norm.dtype(), norm.device()));
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor param = p;
    param.set_grad(mul(g, cast(coef, g.dtype())));
  }
  return norm;
}

}  // namespace ingot::optim
