// CPU row-wise normalizations over the last dim: softmax / log_softmax, layer_norm, rms_norm, forward and
// backward.
//
// Approach: rows are spread over OpenMP threads; each row is widened into a per-thread scratch buffer of Acc
// (float for f32/bf16/f16, double for f64), computed there and rounded once on store. Softmax subtracts the
// row max before exponentiating; layer_norm takes the variance as the mean of squared deviations from the
// mean (two passes over the row) rather than E[x^2] - E[x]^2, which cancels badly.
//
// Shapes (all contiguous): x, y, dx, dy [rows, C]; w, b, dw, db [C]; mean, rstd [rows] (f32, or f64 for f64 x).
// dw / db are sums over rows: each of a fixed number of row blocks accumulates its own partial sums, and the
// partials are added in block order, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/kernels/cpu/loops.h"
#include "runtime/kernels/kernels.h"

namespace ingot::kernels::cpu {
namespace {

// Row blocks for the dw / db partial sums (fixed so the summation order is too).
constexpr int64_t kMaxRowBlocks = 64;

// Runs body(row, scratch) over every row; scratch holds `nbufs` per-thread buffers of `cols` Acc each.
template <typename Acc, typename F>
void for_each_row(int64_t rows, int64_t cols, int nbufs, F body) {
#pragma omp parallel if (rows > 1 && rows * cols >= kParallelGrain)
  {
    std::vector<Acc> scratch(static_cast<size_t>(cols * nbufs));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) body(r, scratch.data());
  }
}

inline const void* row_ptr(const Tensor& t, int64_t row, int64_t cols) {
  return static_cast<const char*>(t.data_ptr()) + row * cols * static_cast<int64_t>(itemsize(t.dtype()));
}
inline void* row_ptr_mut(const Tensor& t, int64_t row, int64_t cols) {
  return static_cast<char*>(t.data_ptr()) + row * cols * static_cast<int64_t>(itemsize(t.dtype()));
}

// w (or b) widened to Acc, or `fallback` repeated when the tensor is undefined.
template <typename Acc>
std::vector<Acc> load_or(const Tensor& t, int64_t cols, Acc fallback) {
  return t.defined() ? load_all<Acc>(t) : std::vector<Acc>(static_cast<size_t>(cols), fallback);
}

template <typename Acc>
void softmax_fwd_impl(const Tensor& y, const Tensor& x, bool log) {
  auto [rows, cols] = rows_cols(x);
  for_each_row<Acc>(rows, cols, 1, [&](int64_t r, Acc* v) {
    load_strided<Acc>(x.dtype(), row_ptr(x, r, cols), 1, cols, v);
    Acc mx = -std::numeric_limits<Acc>::infinity();
    for (int64_t i = 0; i < cols; ++i) mx = std::max(mx, v[i]);
    Acc s = 0;
    if (log) {
      for (int64_t i = 0; i < cols; ++i) s += std::exp(v[i] - mx);
      const Acc shift = mx + std::log(s);
      for (int64_t i = 0; i < cols; ++i) v[i] -= shift;
    } else {
      for (int64_t i = 0; i < cols; ++i) s += (v[i] = std::exp(v[i] - mx));
      const Acc inv = Acc(1) / s;
      for (int64_t i = 0; i < cols; ++i) v[i] *= inv;
    }
    store_strided<Acc>(y.dtype(), row_ptr_mut(y, r, cols), 1, cols, v);
  });
}

// softmax:     dx = y * (dy - sum(dy * y))
// log_softmax: dx = dy - exp(y) * sum(dy)
template <typename Acc>
void softmax_bwd_impl(const Tensor& dx, const Tensor& dy, const Tensor& y, bool log) {
  auto [rows, cols] = rows_cols(y);
  for_each_row<Acc>(rows, cols, 2, [&](int64_t r, Acc* buf) {
    Acc *g = buf, *v = buf + cols;
    load_strided<Acc>(dy.dtype(), row_ptr(dy, r, cols), 1, cols, g);
    load_strided<Acc>(y.dtype(), row_ptr(y, r, cols), 1, cols, v);
    Acc s = 0;
    if (log) {
      for (int64_t i = 0; i < cols; ++i) s += g[i];
      for (int64_t i = 0; i < cols; ++i) g[i] -= std::exp(v[i]) * s;
    } else {
      for (int64_t i = 0; i < cols; ++i) s += g[i] * v[i];
      for (int64_t i = 0; i < cols; ++i) g[i] = v[i] * (g[i] - s);
    }
    store_strided<Acc>(dx.dtype(), row_ptr_mut(dx, r, cols), 1, cols, g);
  });
}

inline void store_stat(const Tensor& t, int64_t row, double v) {
  store_strided<double>(t.dtype(), row_ptr_mut(t, row, 1), 1, 1, &v);
}

template <typename Acc>
void layer_norm_fwd_impl(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& w,
                         const Tensor& b, double eps) {
  auto [rows, cols] = rows_cols(x);
  const std::vector<Acc> wv = load_or<Acc>(w, cols, Acc(1)), bv = load_or<Acc>(b, cols, Acc(0));
  for_each_row<Acc>(rows, cols, 1, [&](int64_t r, Acc* v) {
    load_strided<Acc>(x.dtype(), row_ptr(x, r, cols), 1, cols, v);
    Acc mu = 0;
    for (int64_t i = 0; i < cols; ++i) mu += v[i];
    mu /= static_cast<Acc>(cols);
    Acc var = 0;
    for (int64_t i = 0; i < cols; ++i) var += (v[i] - mu) * (v[i] - mu);
    var /= static_cast<Acc>(cols);
    const Acc rs = Acc(1) / std::sqrt(var + static_cast<Acc>(eps));
    for (int64_t i = 0; i < cols; ++i) v[i] = (v[i] - mu) * rs * wv[i] + bv[i];
    store_strided<Acc>(y.dtype(), row_ptr_mut(y, r, cols), 1, cols, v);
    store_stat(mean, r, mu);
    store_stat(rstd, r, rs);
  });
}

template <typename Acc>
void rms_norm_fwd_impl(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  auto [rows, cols] = rows_cols(x);
  const std::vector<Acc> wv = load_or<Acc>(w, cols, Acc(1));
  for_each_row<Acc>(rows, cols, 1, [&](int64_t r, Acc* v) {
    load_strided<Acc>(x.dtype(), row_ptr(x, r, cols), 1, cols, v);
    Acc ss = 0;
    for (int64_t i = 0; i < cols; ++i) ss += v[i] * v[i];
    const Acc rs = Acc(1) / std::sqrt(ss / static_cast<Acc>(cols) + static_cast<Acc>(eps));
    for (int64_t i = 0; i < cols; ++i) v[i] = v[i] * rs * wv[i];
    store_strided<Acc>(y.dtype(), row_ptr_mut(y, r, cols), 1, cols, v);
    store_stat(rstd, r, rs);
  });
}

// Shared backward of layer_norm (centered = true) and rms_norm (centered = false, mean = 0). With
// xhat = (x - mean) * rstd and g = dy * w:
//   dx = rstd * (g - [centered] mean(g) - xhat * mean(g * xhat)),  dw = sum_rows dy * xhat,  db = sum_rows dy.
template <typename Acc>
void norm_bwd_impl(bool centered, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w) {
  auto [rows, cols] = rows_cols(x);
  const std::vector<Acc> wv = load_or<Acc>(w, cols, Acc(1));
  const std::vector<Acc> mv = centered ? load_all<Acc>(mean) : std::vector<Acc>(static_cast<size_t>(rows), Acc(0));
  const std::vector<Acc> rv = load_all<Acc>(rstd);
  const int64_t blocks = std::min(rows, kMaxRowBlocks);
  const int64_t per_block = blocks ? (rows + blocks - 1) / blocks : 0;
  const bool want_dw = dw.defined(), want_db = db.defined();
  std::vector<Acc> part_dw(want_dw ? static_cast<size_t>(blocks * cols) : 0);
  std::vector<Acc> part_db(want_db ? static_cast<size_t>(blocks * cols) : 0);
  const Acc inv_c = Acc(1) / static_cast<Acc>(std::max<int64_t>(cols, 1));
#pragma omp parallel if (blocks > 1 && rows * cols >= kParallelGrain)
  {
    std::vector<Acc> gbuf(static_cast<size_t>(cols)), xbuf(static_cast<size_t>(cols));
    Acc *g = gbuf.data(), *xh = xbuf.data();
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      Acc* pdw = want_dw ? part_dw.data() + blk * cols : nullptr;
      Acc* pdb = want_db ? part_db.data() + blk * cols : nullptr;
      for (int64_t r = blk * per_block; r < std::min(rows, (blk + 1) * per_block); ++r) {
        load_strided<Acc>(dy.dtype(), row_ptr(dy, r, cols), 1, cols, g);
        load_strided<Acc>(x.dtype(), row_ptr(x, r, cols), 1, cols, xh);
        const Acc mu = mv[r], rs = rv[r];
        Acc sum_g = 0, sum_gx = 0;
        for (int64_t i = 0; i < cols; ++i) {
          xh[i] = (xh[i] - mu) * rs;
          if (pdw) pdw[i] += g[i] * xh[i];
          if (pdb) pdb[i] += g[i];
          g[i] *= wv[i];
          sum_g += g[i];
          sum_gx += g[i] * xh[i];
        }
        if (!dx.defined()) continue;
        const Acc mean_g = centered ? sum_g * inv_c : Acc(0), mean_gx = sum_gx * inv_c;
        for (int64_t i = 0; i < cols; ++i) g[i] = rs * (g[i] - mean_g - xh[i] * mean_gx);
        store_strided<Acc>(dx.dtype(), row_ptr_mut(dx, r, cols), 1, cols, g);
      }
    }
  }
  auto reduce_partials = [&](const std::vector<Acc>& part, const Tensor& out) {
    std::vector<Acc> total(static_cast<size_t>(cols), Acc(0));
    for (int64_t blk = 0; blk < blocks; ++blk)
      for (int64_t i = 0; i < cols; ++i) total[i] += part[blk * cols + i];
    store_strided<Acc>(out.dtype(), out.data_ptr(), 1, cols, total.data());
  };
  if (want_dw) reduce_partials(part_dw, dw);
  if (want_db) reduce_partials(part_db, db);
}

bool wide(const Tensor& x) { return needs_double({x.dtype()}); }

}  // namespace

void softmax_fwd(const Tensor& y, const Tensor& x, bool log) {
  if (wide(x)) softmax_fwd_impl<double>(y, x, log);
  else softmax_fwd_impl<float>(y, x, log);
}

void softmax_bwd(const Tensor& dx, const Tensor& dy, const Tensor& y, bool log) {
  if (wide(y)) softmax_bwd_impl<double>(dx, dy, y, log);
  else softmax_bwd_impl<float>(dx, dy, y, log);
}

void layer_norm_fwd(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& w,
                    const Tensor& b, double eps) {
  if (wide(x)) layer_norm_fwd_impl<double>(y, mean, rstd, x, w, b, eps);
  else layer_norm_fwd_impl<float>(y, mean, rstd, x, w, b, eps);
}

void layer_norm_bwd(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                    const Tensor& mean, const Tensor& rstd, const Tensor& w) {
  if (wide(x)) norm_bwd_impl<double>(true, dx, dw, db, dy, x, mean, rstd, w);
  else norm_bwd_impl<float>(true, dx, dw, db, dy, x, mean, rstd, w);
}

void rms_norm_fwd(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  if (wide(x)) rms_norm_fwd_impl<double>(y, rstd, x, w, eps);
  else rms_norm_fwd_impl<float>(y, rstd, x, w, eps);
}

void rms_norm_bwd(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                  const Tensor& w) {
  if (wide(x)) norm_bwd_impl<double>(false, dx, dw, Tensor(), dy, x, Tensor(), rstd, w);
  else norm_bwd_impl<float>(false, dx, dw, Tensor(), dy, x, Tensor(), rstd, w);
}

}  // namespace ingot::kernels::cpu
