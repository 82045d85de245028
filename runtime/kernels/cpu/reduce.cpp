// CPU reductions: sum, mean, prod, max, min, argmax, argmin, logsumexp over the middle dim of a contiguous
// input read as [outer, n, inner]; out is contiguous [outer, inner].
//
// Approach: outputs are processed in "lanes" of up to kChunk independent accumulators held as arrays
// (vectorizable updates). With inner > 1 a lane is one output column and each reduced row is one contiguous
// load. With inner == 1 (reducing the last dim) a row of n is cut into rows of W contiguous elements and lane k
// folds elements k, k + W, ...; the lanes are then combined. When there are few outputs (a full reduction),
// n is split into segments so threads share one output; each segment leaves a Partial, and partials are
// combined in a fixed order, so results do not depend on the thread count.
//
// Numerics: floating inputs accumulate in double (bf16/f16/f32 sums do not lose precision to the input
// type); integral inputs accumulate in int64 (exact), except mean and logsumexp. Max/min propagate NaN,
// argmax/argmin return the first index of the extreme (a NaN counts as the extreme, as in PyTorch);
// logsumexp subtracts the per-lane maximum before exponentiating and merges lanes with the usual rescaling.
#include <cmath>
#include <limits>

#include "runtime/kernels/cpu/loops.h"
#include "runtime/kernels/kernels.h"

namespace ingot::kernels::cpu {
namespace {

// Elements a segment of a reduced row should hold at least, so splitting n pays for its combine.
constexpr int64_t kMinSegment = 1 << 14;
// With at least this many independent work units, n is not split.
constexpr int64_t kEnoughUnits = 64;

template <typename Acc>
struct Partial {
  Acc v;          // running sum / product / extreme (the maximum for logsumexp)
  double s;       // logsumexp: sum of exp(x - v)
  int64_t idx;    // argmax / argmin position
};

template <typename Acc>
bool is_nan(Acc v) {
  if constexpr (std::is_floating_point_v<Acc>) return v != v;
  else return false;
}

// Whether candidate (v, i) replaces the current extreme (cur, ci) for max (sign > 0) or min.
template <typename Acc>
bool better(Acc v, int64_t i, Acc cur, int64_t ci, bool max) {
  if (is_nan(cur)) return is_nan(v) && i < ci;
  if (is_nan(v)) return true;
  if (v == cur) return i < ci;
  return max ? v > cur : v < cur;
}

// SoA state of up to kChunk lanes.
template <typename Acc>
struct Lanes {
  Acc v[kChunk];
  double s[kChunk];
  int64_t idx[kChunk];

  void init(const Acc* x, int64_t len, int64_t i) {
    for (int64_t k = 0; k < len; ++k) {
      v[k] = x[k];
      s[k] = 0.0;
      idx[k] = i;
    }
  }
  // Folds row x (len lanes) at reduced position i into the state (first pass).
  void update(ReduceOp op, const Acc* x, int64_t len, int64_t i) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Mean:
        for (int64_t k = 0; k < len; ++k) v[k] += x[k];
        break;
      case ReduceOp::Prod:
        for (int64_t k = 0; k < len; ++k) v[k] *= x[k];
        break;
      case ReduceOp::Max:
      case ReduceOp::LogSumExp:
        for (int64_t k = 0; k < len; ++k) v[k] = (is_nan(x[k]) || x[k] > v[k]) ? x[k] : v[k];
        break;
      case ReduceOp::Min:
        for (int64_t k = 0; k < len; ++k) v[k] = (is_nan(x[k]) || x[k] < v[k]) ? x[k] : v[k];
        break;
      case ReduceOp::ArgMax:
      case ReduceOp::ArgMin: {
        const bool max = op == ReduceOp::ArgMax;
        // Rows arrive in increasing i, so a tie never replaces the earlier index.
        for (int64_t k = 0; k < len; ++k)
          if (!is_nan(v[k]) && (is_nan(x[k]) || (max ? x[k] > v[k] : x[k] < v[k]))) {
            v[k] = x[k];
            idx[k] = i;
          }
        break;
      }
    }
  }
  // logsumexp second pass: v holds the lane maximum. x - v <= 0, so exp in float (for inputs narrower than
  // f64) loses nothing the f32-or-narrower result could show, and is several times faster.
  void add_exp(const Acc* x, int64_t len, bool wide) {
    if (wide) {
      for (int64_t k = 0; k < len; ++k) s[k] += std::exp(static_cast<double>(x[k]) - static_cast<double>(v[k]));
    } else {
      for (int64_t k = 0; k < len; ++k) s[k] += std::exp(static_cast<float>(x[k] - v[k]));
    }
  }
  // exp(x - inf) is NaN; such lanes are decided by their maximum alone (see finalize).
  void clear_nonfinite_sums(int64_t len) {
    for (int64_t k = 0; k < len; ++k)
      if (!std::isfinite(static_cast<double>(v[k]))) s[k] = 0.0;
  }
  Partial<Acc> get(int64_t k) const { return {v[k], s[k], idx[k]}; }
};

template <typename Acc>
void combine(ReduceOp op, Partial<Acc>& p, const Partial<Acc>& q) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: p.v += q.v; break;
    case ReduceOp::Prod: p.v *= q.v; break;
    case ReduceOp::Max:
      if (is_nan(q.v) || q.v > p.v) p.v = q.v;
      break;
    case ReduceOp::Min:
      if (is_nan(q.v) || q.v < p.v) p.v = q.v;
      break;
    case ReduceOp::ArgMax:
    case ReduceOp::ArgMin:
      if (better(q.v, q.idx, p.v, p.idx, op == ReduceOp::ArgMax)) {
        p.v = q.v;
        p.idx = q.idx;
      }
      break;
    case ReduceOp::LogSumExp: {
      const double a = static_cast<double>(p.v), b = static_cast<double>(q.v);
      if (is_nan(p.v) || is_nan(q.v)) {
        p.v = is_nan(p.v) ? p.v : q.v;
        break;
      }
      const double m = std::max(a, b);
      if (std::isfinite(m)) p.s = (std::isfinite(a) ? p.s * std::exp(a - m) : 0.0) +
                                  (std::isfinite(b) ? q.s * std::exp(b - m) : 0.0);
      p.v = static_cast<Acc>(m);
      break;
    }
  }
}

template <typename Acc>
void reduce_impl(ReduceOp op, const Tensor& out, const Tensor& in, int64_t outer, int64_t n, int64_t inner) {
  const DType dt = in.dtype();
  const bool wide = dt == DType::f64 || dt == DType::i64;
  const int64_t esz = static_cast<int64_t>(itemsize(dt));
  const char* base = static_cast<const char*>(in.data_ptr());
  const bool last_dim = inner == 1;
  const int64_t colblocks = last_dim ? 1 : (inner + kChunk - 1) / kChunk;
  const int64_t units = outer * colblocks;
  // Rows of the reduced dim per segment (for last_dim, elements per segment).
  const int64_t row_elems = last_dim ? 1 : std::min(inner, kChunk);
  int64_t seg_rows = n;
  if (units < kEnoughUnits) {
    const int64_t wanted = (kEnoughUnits + units - 1) / units;
    seg_rows = std::max((n + wanted - 1) / wanted, std::max<int64_t>(1, kMinSegment / row_elems));
  }
  const int64_t nsegs = (n + seg_rows - 1) / seg_rows;
  const int64_t tasks = units * nsegs;
  const int64_t outputs = outer * inner;
  std::vector<Partial<Acc>> partials(static_cast<size_t>(outputs * nsegs));

#pragma omp parallel if (in.numel() >= kParallelGrain && tasks > 1)
  {
    alignas(64) Acc buf[kChunk];
    Lanes<Acc> lanes;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t unit = t / nsegs, seg = t % nsegs;
      const int64_t o = unit / colblocks, cb = unit % colblocks;
      const int64_t r0 = seg * seg_rows, r1 = std::min(n, r0 + seg_rows);
      if (last_dim) {
        // Segment [r0, r1) of row o, as rows of W contiguous elements; lane k sees positions r0 + k + j*W.
        const int64_t len = r1 - r0, w = std::min(kChunk, len);
        const char* row = base + (o * n + r0) * esz;
        for (int pass = 0; pass < (op == ReduceOp::LogSumExp ? 2 : 1); ++pass) {
          for (int64_t j = 0; j < len; j += w) {
            const int64_t m = std::min(w, len - j);
            load_strided<Acc>(dt, row + j * esz, 1, m, buf);
            if (pass == 1) {
              lanes.add_exp(buf, m, wide);
            } else if (j == 0) {
              lanes.init(buf, m, r0);
              for (int64_t k = 0; k < m; ++k) lanes.idx[k] = r0 + k;
            } else if (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin) {
              // Lane k's candidates come at distinct positions; update's "i" is per lane here.
              for (int64_t k = 0; k < m; ++k)
                if (better(buf[k], r0 + j + k, lanes.v[k], lanes.idx[k], op == ReduceOp::ArgMax)) {
                  lanes.v[k] = buf[k];
                  lanes.idx[k] = r0 + j + k;
                }
            } else {
              lanes.update(op, buf, m, 0);
            }
          }
        }
        if (op == ReduceOp::LogSumExp) lanes.clear_nonfinite_sums(w);
        Partial<Acc> p = lanes.get(0);
        for (int64_t k = 1; k < w; ++k) combine(op, p, lanes.get(k));
        partials[static_cast<size_t>(o * nsegs + seg)] = p;
      } else {
        const int64_t j0 = cb * kChunk, w = std::min(kChunk, inner - j0);
        for (int pass = 0; pass < (op == ReduceOp::LogSumExp ? 2 : 1); ++pass) {
          for (int64_t i = r0; i < r1; ++i) {
            load_strided<Acc>(dt, base + ((o * n + i) * inner + j0) * esz, 1, w, buf);
            if (pass == 1) lanes.add_exp(buf, w, wide);
            else if (i == r0) lanes.init(buf, w, i);
            else lanes.update(op, buf, w, i);
          }
        }
        if (op == ReduceOp::LogSumExp) lanes.clear_nonfinite_sums(w);
        for (int64_t k = 0; k < w; ++k)
          partials[static_cast<size_t>((o * inner + j0 + k) * nsegs + seg)] = lanes.get(k);
      }
    }
  }

  dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* dst = out.data<T>();
#pragma omp parallel for schedule(static) if (outputs * nsegs >= kParallelGrain)
    for (int64_t j = 0; j < outputs; ++j) {
      const Partial<Acc>* ps = partials.data() + j * nsegs;
      Partial<Acc> p = ps[0];
      for (int64_t s = 1; s < nsegs; ++s) combine(op, p, ps[s]);
      switch (op) {
        case ReduceOp::ArgMax:
        case ReduceOp::ArgMin: store_one(dst + j, p.idx); break;
        case ReduceOp::Mean: store_one(dst + j, static_cast<double>(p.v) / static_cast<double>(n)); break;
        case ReduceOp::LogSumExp: {
          const double m = static_cast<double>(p.v);
          store_one(dst + j, std::isfinite(m) ? m + std::log(p.s) : m);
          break;
        }
        default: store_one(dst + j, p.v); break;
      }
    }
  });
}

// The value of an empty reduction (only ops with an identity reach here).
double empty_value(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return 0.0;
    case ReduceOp::Prod: return 1.0;
    case ReduceOp::Mean: return std::numeric_limits<double>::quiet_NaN();
    case ReduceOp::LogSumExp: return -std::numeric_limits<double>::infinity();
    default: break;
  }
  INGOT_FAIL("reduce: ", reduce_name(op), " of an empty dimension has no identity");
}

}  // namespace

void reduce(ReduceOp op, const Tensor& out, const Tensor& in, int64_t outer, int64_t n, int64_t inner) {
  INGOT_INTERNAL_CHECK(in.is_contiguous() && out.is_contiguous(), "reduce: operands must be contiguous");
  INGOT_INTERNAL_CHECK(in.numel() == outer * n * inner && out.numel() == outer * inner, "reduce: in has ",
                       in.numel(), " elements, out ", out.numel(), ", for [", outer, ", ", n, ", ", inner, "]");
  INGOT_INTERNAL_CHECK((op != ReduceOp::ArgMax && op != ReduceOp::ArgMin) || out.dtype() == DType::i64,
                       "reduce: arg reductions write i64");
  if (out.numel() == 0) return;
  if (n == 0) {
    fill(out, empty_value(op));
    return;
  }
  const bool exact_int = is_integral(in.dtype()) && op != ReduceOp::Mean && op != ReduceOp::LogSumExp;
  if (exact_int) reduce_impl<int64_t>(op, out, in, outer, n, inner);
  else reduce_impl<double>(op, out, in, outer, n, inner);
}

void sum_pieces(const Tensor& out, const std::vector<Tensor>& pieces, double scale, int64_t /*max_blocks*/) {
  INGOT_INTERNAL_CHECK(out.is_contiguous() && (out.dtype() == DType::f32 || out.dtype() == DType::f64) &&
                           !pieces.empty(), "sum_pieces: expected a contiguous f32/f64 output and pieces");
  const int64_t n = out.numel();
  for (const Tensor& p : pieces)
    INGOT_INTERNAL_CHECK(p.is_contiguous() && p.numel() == n && p.dtype() == pieces[0].dtype() &&
                             is_floating(p.dtype()), "sum_pieces: pieces must be contiguous, of ", n,
                         " elements and one floating dtype");
  dispatch_dtype(out.dtype(), [&](auto otag) {
    using Acc = decltype(otag);
    if constexpr (std::is_floating_point_v<Acc>) {
      Acc* dst = out.data<Acc>();
      dispatch_dtype(pieces[0].dtype(), [&](auto ptag) {
        using T = decltype(ptag);
        std::vector<const T*> src;
        for (const Tensor& p : pieces) src.push_back(p.data<T>());
        const Acc s = static_cast<Acc>(scale);
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
        for (int64_t i = 0; i < n; ++i) {
          Acc acc = load_one<Acc>(src[0] + i);
          for (size_t k = 1; k < src.size(); ++k) acc += load_one<Acc>(src[k] + i);
          dst[i] = acc * s;
        }
      });
    }
  });
}

}  // namespace ingot::kernels::cpu
