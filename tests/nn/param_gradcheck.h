// Finite-difference checks of parameter gradients for f64 modules: parameters live inside the module, so
// they are perturbed in place rather than passed as gradcheck inputs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autograd/nn/module.h"
#include "testing.h"

namespace ingot::testing {

// For each named parameter, compares backward()'s gradient of loss_fn() with central differences on `count`
// elements spread over the tensor.
inline void expect_param_grads(nn::Module& m, const std::function<Tensor()>& loss_fn,
                               const std::vector<std::string>& names, int64_t count = 4, double eps = 1e-6,
                               double rtol = 1e-5, double atol = 1e-7) {
  m.zero_grad();
  loss_fn().backward();
  std::map<std::string, Tensor> params;
  for (auto& [n, t] : m.named_parameters()) params[n] = t;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(params.count(name)) << "no parameter " << name;
    Tensor p = params[name];
    ASSERT_EQ(p.dtype(), DType::f64);
    Tensor g = p.grad();
    ASSERT_TRUE(g.defined());
    std::vector<double> ga = g.to_vector();
    double* d = p.data<double>();
    const int64_t n = p.numel();
    for (int64_t k = 0; k < std::min(count, n); ++k) {
      const int64_t i = count == 1 ? 0 : k * (n - 1) / (std::min(count, n) - 1);
      const double orig = d[i];
      NoGradGuard ng;
      d[i] = orig + eps;
      const double lp = loss_fn().item();
      d[i] = orig - eps;
      const double lm = loss_fn().item();
      d[i] = orig;
      const double num = (lp - lm) / (2 * eps);
      EXPECT_NEAR(ga[static_cast<size_t>(i)], num, atol + rtol * std::abs(num)) << "element " << i;
    }
  }
}

}  // namespace ingot::testing
