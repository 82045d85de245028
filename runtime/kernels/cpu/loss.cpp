// CPU cross-entropy over rows of logits, forward, backward, and both fused, with ignore_index and label
// smoothing.
//
// Approach: rows are spread over OpenMP threads; each row is widened into a per-thread scratch buffer of Acc
// (float for f32/bf16/f16 logits, double for f64) and reduced there. The forward keeps the row's logsumexp
// (lse = max + log(sum(exp(x - max))), stable for any logit range) so the backward can rebuild the softmax as
// exp(x - lse) without another reduction. The fused kernel does both on the widened row while it is in scratch.
//
// Shapes (all contiguous): logits, dlogits [rows, V]; target [rows] i64; loss, lse, dloss [rows] (f32, or f64
// for f64 logits). With ls the label smoothing and t the target of a row:
//   loss  = (1 - ls) * (lse - x[t]) + ls * (lse - mean(x))          (0 where t == ignore_index)
//   dx[c] = dloss * (softmax(x)[c] - (1 - ls) * [c == t] - ls / V)  (0 where t == ignore_index)
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/kernels/cpu/loops.h"
#include "runtime/kernels/kernels.h"

namespace ingot::kernels::cpu {
namespace {

// Runs body(row, scratch) over every row with a per-thread scratch buffer of `cols` Acc.
template <typename Acc, typename F>
void for_each_row(int64_t rows, int64_t cols, F body) {
#pragma omp parallel if (rows > 1 && rows * cols >= kParallelGrain)
  {
    std::vector<Acc> scratch(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) body(r, scratch.data());
  }
}

inline void* row_ptr(const Tensor& t, int64_t row, int64_t cols) {
  return static_cast<char*>(t.data_ptr()) + row * cols * static_cast<int64_t>(itemsize(t.dtype()));
}

// Targets are user data: check them all before any thread starts (an exception cannot leave an OpenMP region).
const int64_t* checked_targets(const Tensor& target, int64_t rows, int64_t classes, int64_t ignore_index) {
  INGOT_CHECK(target.dtype() == DType::i64, "cross_entropy: expected target of dtype i64, got ",
              dtype_name(target.dtype()));
  INGOT_INTERNAL_CHECK(target.numel() == rows, "cross_entropy kernel: ", target.numel(), " targets for ", rows,
                       " rows");
  const int64_t* t = target.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r)
    INGOT_CHECK(t[r] == ignore_index || (t[r] >= 0 && t[r] < classes), "cross_entropy: target ", t[r], " at row ",
                r, " is outside [0, ", classes, ") and is not ignore_index (", ignore_index, ")");
  return t;
}

// One row's (lse, loss) from its logits widened to Acc; shared by the forward and the fused kernel so both give
// the same bits.
template <typename Acc>
std::pair<Acc, Acc> row_lse_loss(const Acc* v, int64_t classes, int64_t t, int64_t ignore_index, Acc ls) {
  Acc mx = -std::numeric_limits<Acc>::infinity(), total = 0;
  for (int64_t i = 0; i < classes; ++i) {
    mx = std::max(mx, v[i]);
    total += v[i];
  }
  Acc s = 0;
  for (int64_t i = 0; i < classes; ++i) s += std::exp(v[i] - mx);
  const Acc l = mx + std::log(s);
  if (t == ignore_index) return {l, Acc(0)};
  Acc row_loss = (Acc(1) - ls) * (l - v[t]);
  // Guarded so a -inf logit (a masked class) does not turn 0 * inf into NaN when there is no smoothing.
  if (ls > 0) row_loss += ls * (l - total / static_cast<Acc>(classes));
  return {l, row_loss};
}

// Overwrites one row's widened logits with their gradient; shared by the backward and the fused kernel.
template <typename Acc>
void row_grad(Acc* v, int64_t classes, int64_t t, int64_t ignore_index, Acc dloss, Acc lse, Acc ls) {
  if (t == ignore_index) {
    std::fill(v, v + classes, Acc(0));
    return;
  }
  const Acc smooth = ls / static_cast<Acc>(classes);
  for (int64_t i = 0; i < classes; ++i) v[i] = dloss * (std::exp(v[i] - lse) - smooth);
  v[t] -= dloss * (Acc(1) - ls);
}

template <typename Acc>
void cross_entropy_fwd_impl(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                            int64_t ignore_index, double label_smoothing) {
  auto [rows, classes] = rows_cols(logits);
  const int64_t* tg = checked_targets(target, rows, classes, ignore_index);
  const Acc ls = static_cast<Acc>(label_smoothing);
  std::vector<Acc> loss_v(static_cast<size_t>(rows)), lse_v(static_cast<size_t>(rows));
  for_each_row<Acc>(rows, classes, [&](int64_t r, Acc* v) {
    load_strided<Acc>(logits.dtype(), row_ptr(logits, r, classes), 1, classes, v);
    std::tie(lse_v[r], loss_v[r]) = row_lse_loss(v, classes, tg[r], ignore_index, ls);
  });
  store_strided<Acc>(loss.dtype(), loss.data_ptr(), 1, rows, loss_v.data());
  store_strided<Acc>(lse.dtype(), lse.data_ptr(), 1, rows, lse_v.data());
}

template <typename Acc>
void cross_entropy_bwd_impl(const Tensor& dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& lse,
                            const Tensor& target, int64_t ignore_index, double label_smoothing) {
  auto [rows, classes] = rows_cols(logits);
  const int64_t* tg = checked_targets(target, rows, classes, ignore_index);
  const std::vector<Acc> dl = load_all<Acc>(dloss), lv = load_all<Acc>(lse);
  const Acc ls = static_cast<Acc>(label_smoothing);
  for_each_row<Acc>(rows, classes, [&](int64_t r, Acc* v) {
    if (tg[r] != ignore_index) load_strided<Acc>(logits.dtype(), row_ptr(logits, r, classes), 1, classes, v);
    row_grad(v, classes, tg[r], ignore_index, dl[r], lv[r], ls);
    store_strided<Acc>(dlogits.dtype(), row_ptr(dlogits, r, classes), 1, classes, v);
  });
}

// The row is widened into scratch before its gradient is stored, so dlogits may be the logits' buffer. The
// separate backward gets lse through an f32 (f64) tensor, which holds Acc exactly, so the results equal
// cross_entropy_fwd then cross_entropy_bwd bit for bit.
template <typename Acc>
void cross_entropy_fused_impl(const Tensor& loss, const Tensor& lse, const Tensor& dlogits, const Tensor& logits,
                              const Tensor& target, const Tensor& dloss, int64_t ignore_index,
                              double label_smoothing) {
  auto [rows, classes] = rows_cols(logits);
  INGOT_INTERNAL_CHECK(dlogits.shape() == logits.shape() && dlogits.dtype() == logits.dtype(),
                       "cross_entropy_fused kernel: dlogits ", shape_str(dlogits.shape()), " ",
                       dtype_name(dlogits.dtype()), " for logits ", shape_str(logits.shape()), " ",
                       dtype_name(logits.dtype()));
  const int64_t* tg = checked_targets(target, rows, classes, ignore_index);
  const std::vector<Acc> dl = load_all<Acc>(dloss);
  const Acc ls = static_cast<Acc>(label_smoothing);
  std::vector<Acc> loss_v(static_cast<size_t>(rows)), lse_v(static_cast<size_t>(rows));
  for_each_row<Acc>(rows, classes, [&](int64_t r, Acc* v) {
    load_strided<Acc>(logits.dtype(), row_ptr(logits, r, classes), 1, classes, v);
    std::tie(lse_v[r], loss_v[r]) = row_lse_loss(v, classes, tg[r], ignore_index, ls);
    row_grad(v, classes, tg[r], ignore_index, dl[r], lse_v[r], ls);
    store_strided<Acc>(dlogits.dtype(), row_ptr(dlogits, r, classes), 1, classes, v);
  });
  store_strided<Acc>(loss.dtype(), loss.data_ptr(), 1, rows, loss_v.data());
  store_strided<Acc>(lse.dtype(), lse.data_ptr(), 1, rows, lse_v.data());
}

}  // namespace

void cross_entropy_fwd(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                       int64_t ignore_index, double label_smoothing) {
  if (needs_double({logits.dtype()}))
    cross_entropy_fwd_impl<double>(loss, lse, logits, target, ignore_index, label_smoothing);
  else cross_entropy_fwd_impl<float>(loss, lse, logits, target, ignore_index, label_smoothing);
}

void cross_entropy_bwd(const Tensor& dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& lse,
                       const Tensor& target, int64_t ignore_index, double label_smoothing) {
  if (needs_double({logits.dtype()}))
    cross_entropy_bwd_impl<double>(dlogits, dloss, logits, lse, target, ignore_index, label_smoothing);
  else cross_entropy_bwd_impl<float>(dlogits, dloss, logits, lse, target, ignore_index, label_smoothing);
}

void cross_entropy_fused(const Tensor& loss, const Tensor& lse, const Tensor& dlogits, const Tensor& logits,
                         const Tensor& target, const Tensor& dloss, int64_t ignore_index, double label_smoothing) {
  if (needs_double({logits.dtype()}))
    cross_entropy_fused_impl<double>(loss, lse, dlogits, logits, target, dloss, ignore_index, label_smoothing);
  else cross_entropy_fused_impl<float>(loss, lse, dlogits, logits, target, dloss, ignore_index, label_smoothing);
}

}  // namespace ingot::kernels::cpu
