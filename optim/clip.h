// Gradient clipping by the global L2 norm over all gradients (torch.nn.utils.clip_grad_norm_).
#pragma once

#include <functional>
#include <vector>

#include "runtime/tensor.h"

namespace ingot::optim {

// sqrt(sum over defined grads of sum(g^2)), accumulated in f32 on the device, returned as a double.
double grad_norm(const std::vector<Tensor>& params);
// The factor clipping multiplies gradients by: min(1, max_norm / (total_norm + 1e-6)).
double clip_coefficient(double total_norm, double max_norm);
// Scales every defined grad in place by clip_coefficient; returns the norm before clipping. To clip inside
// the fused optimizer step instead, call grad_norm and Optimizer::set_grad_scale(clip_coefficient(...)).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// The same clipping without a host sync: the norm stays a device scalar (f32) and every defined grad is
// replaced by grad * min(1, max_norm / (norm + 1e-6)), all with tensor ops, so it traces into a compiled
// step (ingot::compile) with no graph break. Returns the norm before clipping. `combine`, when given, maps
// this process's sum of squares to the global one (ZeRO-1: each rank holds the gradients of its shards only,
// so the squares are summed across ranks) before the norm is taken.
Tensor clip_grad_norm_tensor(const std::vector<Tensor>& params, double max_norm,
                             const std::function<Tensor(const Tensor&)>& combine = {});

}  // namespace ingot::optim
