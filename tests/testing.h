// Shared test helpers: float64 finite-difference gradient checks and GPU-skip macros.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "runtime/rng.h"

namespace ingot::testing {

// Skips the current test with a visible reason when no CUDA device is usable.
#define INGOT_REQUIRE_CUDA()                                                        \
  do {                                                                              \
    if (!::ingot::cuda_available())                                                 \
      GTEST_SKIP() << "no CUDA device (built with CUDA: " << INGOT_BUILT_WITH_CUDA  \
                   << "); this test runs on the lent GPU machine";                  \
  } while (0)
#ifdef INGOT_WITH_CUDA
#define INGOT_BUILT_WITH_CUDA "yes"
#else
#define INGOT_BUILT_WITH_CUDA "no"
#endif

// A non-contiguous f64 tensor with the given logical shape and random values: built as the transpose of a
// contiguous tensor so kernels see real strides.
inline Tensor randn_noncontig(const Shape& shape, double scale = 1.0) {
  if (shape.size() < 2) return randn(shape, DType::f64) * scale;
  Shape t = shape;
  std::swap(t[t.size() - 1], t[t.size() - 2]);
  Tensor base = randn(t, DType::f64) * scale;
  Tensor v = transpose(base, -1, -2).detach();
  return v;
}

struct GradcheckResult {
  bool ok = true;
  std::string message;
};

// Checks d(sum(fn(inputs) * w))/d(input) from backward() against central differences for every input with
// requires_grad, where w is a fixed random cotangent per output. Inputs must be f64 leaves on the CPU.
// Tolerances: |analytic - numeric| <= atol + rtol * |numeric| elementwise.
inline GradcheckResult gradcheck(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                                 std::vector<Tensor> inputs, double eps = 1e-6, double rtol = 1e-5,
                                 double atol = 1e-6) {
  GradcheckResult r;
  std::vector<Tensor> outs = fn(inputs);
  std::vector<Tensor> weights;
  for (const Tensor& o : outs) weights.push_back(is_floating(o.dtype()) ? randn(o.shape(), DType::f64) : Tensor());
  auto objective = [&](const std::vector<Tensor>& in) {
    NoGradGuard ng;
    std::vector<Tensor> os = fn(in);
    double total = 0;
    for (size_t k = 0; k < os.size(); ++k) {
      if (!weights[k].defined()) continue;
      std::vector<double> a = os[k].to_vector(), w = weights[k].to_vector();
      for (size_t i = 0; i < a.size(); ++i) total += a[i] * w[i];
    }
    return total;
  };
  for (Tensor& t : inputs)
    if (t.requires_grad()) t.zero_grad();
  Tensor loss;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!weights[k].defined() || !outs[k].requires_grad()) continue;
    Tensor term = sum(mul(outs[k], weights[k]));
    loss = loss.defined() ? add(loss, term) : term;
  }
  if (!loss.defined()) {
    r.ok = false;
    r.message = "no output requires grad";
    return r;
  }
  loss.backward();
  for (size_t idx = 0; idx < inputs.size(); ++idx) {
    Tensor& x = inputs[idx];
    if (!x.requires_grad()) continue;
    Tensor g = x.grad();
    if (!g.defined()) {
      r.ok = false;
      r.message += "input " + std::to_string(idx) + ": no gradient\n";
      continue;
    }
    std::vector<double> ga = g.to_vector();
    // Perturb a contiguous copy of the data, element by element, through a view with x's strides.
    for (int64_t i = 0; i < x.numel(); ++i) {
      std::vector<double> base = x.to_vector();
      auto eval_at = [&](double delta) {
        std::vector<double> v = base;
        v[static_cast<size_t>(i)] += delta;
        std::vector<Tensor> in2 = inputs;
        in2[idx] = from_vector(v, x.shape(), DType::f64);
        return objective(in2);
      };
      double num = (eval_at(eps) - eval_at(-eps)) / (2 * eps);
      double ana = ga[static_cast<size_t>(i)];
      if (!(std::abs(ana - num) <= atol + rtol * std::abs(num))) {
        r.ok = false;
        r.message += "input " + std::to_string(idx) + " element " + std::to_string(i) +
                     ": analytic " + std::to_string(ana) + " vs numeric " + std::to_string(num) + "\n";
        if (r.message.size() > 2000) return r;
      }
    }
  }
  return r;
}

inline Tensor leaf(Tensor t) {
  t = t.detach();
  t.set_requires_grad(true);
  return t;
}

// How many times `what` occurs in `text` (overlapping ones too): nodes of a printed graph, lines of a source.
inline size_t count_occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The message of the ingot::Error that `f` throws; a test failure (and "") when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an ingot::Error";
  return "";
}

}  // namespace ingot::testing

#define EXPECT_GRADCHECK(...)                                   \
  do {                                                          \
    auto _r = ::ingot::testing::gradcheck(__VA_ARGS__);         \
    EXPECT_TRUE(_r.ok) << _r.message;                           \
  } while (0)
