// Helpers of the CUDA kernel tests: the same random operand on the CPU and on the GPU (with the same view:
// contiguous, transposed, strided with an offset, or broadcast), NaN-poisoned outputs, and dtype-aware checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/kernels/kernels.h"
#include "runtime/rng.h"
#include "runtime/tensor.h"

namespace ingot::testing {

inline constexpr DType kFloatDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

enum class Layout { Contiguous, Transposed, Strided, Broadcast };

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous: return "contiguous";
    case Layout::Transposed: return "transposed";
    case Layout::Strided: return "strided";
    case Layout::Broadcast: return "broadcast";
  }
  return "?";
}

// Values of a CPU f64 tensor of the given shape; `map` transforms standard normal draws (domain of an op).
inline Tensor random_values(const Shape& shape, const std::function<double(double)>& map) {
  std::vector<double> v = randn(shape, DType::f64).to_vector();
  for (double& x : v) x = map(x);
  return from_vector(v, shape, DType::f64);
}

struct Operand {
  Tensor cpu, gpu;
};

// The same values on both devices, viewed with `layout` so kernels see real strides and offsets:
//   Transposed: the last two dims swapped in memory; Strided: every other element of a wider base, offset 1;
//   Broadcast: dims 0 and -1 of size 1 in memory, expanded (stride 0).
inline Operand make_operand(const Shape& shape, DType dt, Layout layout,
                            const std::function<double(double)>& map = [](double x) { return x; }) {
  const size_t nd = shape.size();
  if (nd < 2 && layout == Layout::Transposed) layout = Layout::Strided;
  Shape base_shape = shape;
  if (layout == Layout::Transposed) std::swap(base_shape[nd - 1], base_shape[nd - 2]);
  if (layout == Layout::Strided && nd > 0) base_shape.back() = 2 * shape.back() + 1;
  if (layout == Layout::Broadcast && nd > 0) {
    base_shape.front() = 1;
    base_shape.back() = 1;
  }
  Tensor base = random_values(base_shape, map).to(dt);
  auto view = [&](const Tensor& b) {
    switch (layout) {
      case Layout::Contiguous: return b;
      case Layout::Transposed: {
        Strides st = b.strides();
        std::swap(st[nd - 1], st[nd - 2]);
        return b.as_strided(shape, st, b.offset());
      }
      case Layout::Strided: {
        if (nd == 0) return b;
        Strides st = b.strides();
        st.back() = 2;
        return b.as_strided(shape, st, b.offset() + 1);
      }
      case Layout::Broadcast: return b.expand_raw(shape);
    }
    return b;
  };
  return {view(base), view(base.to(Device::cuda(0)))};
}

// An output filled with NaN (integers: a sentinel) so unwritten elements show; made on the CPU and copied, so
// the check does not rely on the fill kernel under test. Transposed outputs are strided views.
inline Tensor poisoned(const Shape& shape, DType dt, Device d, bool transposed = false) {
  Shape base_shape = shape;
  if (transposed) std::swap(base_shape[shape.size() - 1], base_shape[shape.size() - 2]);
  Tensor t = full(base_shape, is_floating(dt) ? NAN : -77.0, dt, Device::cpu()).to(d);
  if (!transposed) return t;
  Strides st = t.strides();
  std::swap(st[shape.size() - 1], st[shape.size() - 2]);
  return t.as_strided(shape, st, 0);
}

struct Tol {
  double rtol, atol;
};

// Elementwise results computed in f32 and rounded once agree to a few f32 ulps; a 16-bit output can differ by
// one of its own ulps when the f32 values straddle a rounding boundary.
inline Tol tol_for(DType t) {
  switch (t) {
    case DType::f32: return {1e-5, 1e-6};
    case DType::f64: return {1e-12, 1e-13};
    case DType::bf16: return {1e-2, 1e-3};
    case DType::f16: return {2e-3, 1e-4};
    default: return {0.0, 1e-300};  // integers and bools: exact
  }
}

// ||a - b|| / ||b|| over all elements (a NaN anywhere gives NaN).
inline double rel_norm_error(const Tensor& a, const Tensor& b) {
  std::vector<double> va = a.to_vector(), vb = b.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    num += (va[i] - vb[i]) * (va[i] - vb[i]);
    den += vb[i] * vb[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Number of elements whose bit patterns differ (after conversion to double, which is exact for every dtype).
inline int64_t count_unequal(const Tensor& a, const Tensor& b) {
  std::vector<double> va = a.to_vector(), vb = b.to_vector();
  int64_t bad = 0;
  for (size_t i = 0; i < va.size(); ++i)
    if (!(va[i] == vb[i] || (std::isnan(va[i]) && std::isnan(vb[i])))) ++bad;
  return bad;
}

// Cross-entropy targets in [0, classes) with every third row ignored (ignore_index -100).
inline Tensor targets_with_ignored_rows(int64_t rows, int64_t classes) {
  std::vector<double> u = rand({rows}, DType::f64).to_vector();
  std::vector<int64_t> t(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    t[r] = r % 3 == 1 ? -100
                      : std::min<int64_t>(classes - 1, static_cast<int64_t>(u[r] * static_cast<double>(classes)));
  return from_vector_i64(t, {rows});
}

// The dtype of a row kernel's statistics (mean, rstd, lse, loss): f64 for f64 inputs, else f32.
inline DType stat_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

// Every element of `out` (any device) is within tol * (|ref| + max(max|ref|, 1)) of `ref`; NaN fails. The inputs
// are of unit scale, so a result that cancels to ~0 (a one-element softmax row's gradient, a cross-entropy
// gradient where the probability meets the smoothing term) is judged against the unit scale of the terms that
// cancelled, not against its own rounding noise.
inline ::testing::AssertionResult close_at_unit_scale(const Tensor& out, const Tensor& ref, double tol) {
  std::vector<double> a = out.to_vector(), b = ref.to_vector();
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  double scale = 1.0;
  for (double v : b) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(a[i] - b[i]) <= tol * (std::abs(b[i]) + scale)))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i] << " (tol " << tol
                                           << ", max |ref| " << scale << ")";
  return ::testing::AssertionSuccess();
}

}  // namespace ingot::testing
