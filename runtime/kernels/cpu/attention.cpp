// CPU reference kernels for the transformer pieces: rotary embedding and scaled dot-product attention.
//
// rope: x, out [B, H, T, D]; cos, sin [T, D/2] f32, or [B, T, D/2] (each batch row its own positions). Pair
// (i, i + D/2) of row t is rotated by angle theta_t,i:
//   out_i = x_i cos - x_{i+D/2} sin,  out_{i+D/2} = x_{i+D/2} cos + x_i sin   (inverse: sin -> -sin)
// With an addend, x + addend (summed in the accumulation type, rounded once with the result) is rotated.
//
// attention: q [B, Hq, T, D], k, v [B, Hkv, S, D], out [B, Hq, T, D], lse [B, Hq, T] f32. Query head h reads
// kv head h / (Hq / Hkv) (grouped-query attention). With `causal`, query i sees key j iff j <= i + (S - T)
// (queries are the last T of S positions); a query that sees no key gets out = 0 and lse = -inf. With positions
// (i64 [B, T], packed documents), query i of row b also masks the keys before its document's first token,
// j < i + (S - T) - positions[b, i]: it sees the keys [i + (S - T) - positions[b, i], i + (S - T)].
//   forward:  P = softmax(scale Q K^T) row-wise over visible keys, out = P V, lse = log sum exp(scale Q K^T)
//   backward: P is recomputed from lse (no [T, S] matrix is kept between the passes, as in flash attention):
//     D_i = rowsum(dO * O),  dP = dO V^T,  dS = P * (dP - D),  dQ = scale dS K,  dK = scale dS^T Q,  dV = P^T dO
// Math runs in f32 for f32/bf16/f16 and in f64 for f64. Each (b, head) block is loaded into Acc buffers once.
// The forward is parallel over (b, query head); the backward over (b, kv head) so that the dK/dV sums over
// the query heads of a group stay inside one thread (no atomics).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/kernels/cpu/loops.h"
#include "runtime/kernels/kernels.h"

namespace ingot::kernels::cpu {
namespace {

struct AttnDims {
  int64_t B, Hq, Hkv, T, S, D;
  int64_t group() const { return Hq / Hkv; }
};

AttnDims attn_dims(const Tensor& q, const Tensor& k) {
  INGOT_INTERNAL_CHECK(q.dim() == 4 && k.dim() == 4, "attention: expected 4-d q and k");
  return {q.shape()[0], q.shape()[1], k.shape()[1], q.shape()[2], k.shape()[2], q.shape()[3]};
}

// Keys visible to query i: [first, end) with end = S, or end = i + (S - T) + 1 when causal; first = 0, or with
// positions (the query's row of them) the first key of its document.
struct KeyRange {
  int64_t first, end;
};
inline KeyRange visible_keys(int64_t i, const AttnDims& d, bool causal, const int64_t* positions) {
  const int64_t end = causal ? std::clamp<int64_t>(i + d.S - d.T + 1, 0, d.S) : d.S;
  const int64_t first = positions ? std::clamp<int64_t>(i + d.S - d.T - positions[i], 0, end) : 0;
  return {first, end};
}

// Row b of positions, or nullptr.
inline const int64_t* positions_row(const Tensor& positions, int64_t b, const AttnDims& d) {
  return positions.defined() ? positions.data<int64_t>() + b * d.T : nullptr;
}

// The simd reduction lets the compiler reassociate the sum (vector lanes), which plain -O3 may not do.
template <typename Acc>
inline Acc dot(const Acc* a, const Acc* b, int64_t n) {
  Acc s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < n; ++k) s += a[k] * b[k];
  return s;
}

// Loads/stores block number `block` (of `n` elements each) of a contiguous tensor.
template <typename Acc>
void load_block(const Tensor& t, int64_t block, int64_t n, Acc* dst) {
  const char* base = static_cast<const char*>(t.data_ptr()) + block * n * static_cast<int64_t>(itemsize(t.dtype()));
  load_strided<Acc>(t.dtype(), base, 1, n, dst);
}
template <typename Acc>
void store_block(const Tensor& t, int64_t block, int64_t n, const Acc* src) {
  char* base = static_cast<char*>(t.data_ptr()) + block * n * static_cast<int64_t>(itemsize(t.dtype()));
  store_strided<Acc>(t.dtype(), base, 1, n, src);
}

template <typename Acc>
void attention_fwd_impl(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& positions, bool causal, Acc scale) {
  const AttnDims d = attn_dims(q, k);
  const int64_t tasks = d.B * d.Hq;
  float* lse_p = lse.data<float>();
#pragma omp parallel for schedule(dynamic) if (tasks > 1 && tasks * d.T * d.S * d.D >= kParallelGrain)
  for (int64_t bh = 0; bh < tasks; ++bh) {
    const int64_t b = bh / d.Hq, kvh = b * d.Hkv + (bh % d.Hq) / d.group();
    std::vector<Acc> qb(static_cast<size_t>(d.T * d.D)), kb(static_cast<size_t>(d.S * d.D)),
        vb(static_cast<size_t>(d.S * d.D)), ob(static_cast<size_t>(d.T * d.D), Acc(0)), p(static_cast<size_t>(d.S));
    load_block(q, bh, d.T * d.D, qb.data());
    load_block(k, kvh, d.S * d.D, kb.data());
    load_block(v, kvh, d.S * d.D, vb.data());
    const int64_t* pos = positions_row(positions, b, d);
    for (int64_t i = 0; i < d.T; ++i) {
      const auto [first, n] = visible_keys(i, d, causal, pos);
      if (first == n) {
        lse_p[bh * d.T + i] = -std::numeric_limits<float>::infinity();
        continue;
      }
      const Acc* qi = &qb[static_cast<size_t>(i * d.D)];
      Acc m = -std::numeric_limits<Acc>::infinity();
      for (int64_t j = first; j < n; ++j) {
        p[j] = scale * dot(qi, &kb[static_cast<size_t>(j * d.D)], d.D);
        m = std::max(m, p[j]);
      }
      Acc l = 0;
      for (int64_t j = first; j < n; ++j) l += (p[j] = std::exp(p[j] - m));
      Acc* oi = &ob[static_cast<size_t>(i * d.D)];
      for (int64_t j = first; j < n; ++j) {
        const Acc w = p[j] / l;
        const Acc* vj = &vb[static_cast<size_t>(j * d.D)];
        for (int64_t c = 0; c < d.D; ++c) oi[c] += w * vj[c];
      }
      lse_p[bh * d.T + i] = static_cast<float>(m + std::log(l));
    }
    store_block(out, bh, d.T * d.D, ob.data());
  }
}

template <typename Acc>
void attention_bwd_impl(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& positions, bool causal, Acc scale) {
  const AttnDims d = attn_dims(q, k);
  const int64_t tasks = d.B * d.Hkv;
  const float* lse_p = lse.data<float>();
  const size_t td = static_cast<size_t>(d.T * d.D), sd = static_cast<size_t>(d.S * d.D);
#pragma omp parallel for schedule(dynamic) if (tasks > 1 && d.B * d.Hq * d.T * d.S * d.D >= kParallelGrain)
  for (int64_t bk = 0; bk < tasks; ++bk) {
    const int64_t b = bk / d.Hkv, h0 = (bk % d.Hkv) * d.group();
    std::vector<Acc> kb(sd), vb(sd), dkb(sd, Acc(0)), dvb(sd, Acc(0));
    std::vector<Acc> qb(td), ob(td), dob(td), dqb(td);
    load_block(k, bk, d.S * d.D, kb.data());
    load_block(v, bk, d.S * d.D, vb.data());
    const int64_t* pos = positions_row(positions, b, d);
    for (int64_t h = h0; h < h0 + d.group(); ++h) {
      const int64_t bh = b * d.Hq + h;
      load_block(q, bh, d.T * d.D, qb.data());
      load_block(out, bh, d.T * d.D, ob.data());
      load_block(dout, bh, d.T * d.D, dob.data());
      std::fill(dqb.begin(), dqb.end(), Acc(0));
      for (int64_t i = 0; i < d.T; ++i) {
        const auto [first, n] = visible_keys(i, d, causal, pos);
        if (first == n) continue;
        const size_t row = static_cast<size_t>(i * d.D);
        const Acc *qi = &qb[row], *doi = &dob[row];
        Acc* dqi = &dqb[row];
        const Acc lse_i = static_cast<Acc>(lse_p[bh * d.T + i]);
        const Acc di = dot(doi, &ob[row], d.D);
        for (int64_t j = first; j < n; ++j) {
          const size_t col = static_cast<size_t>(j * d.D);
          const Acc *kj = &kb[col], *vj = &vb[col];
          const Acc pij = std::exp(scale * dot(qi, kj, d.D) - lse_i);
          const Acc ds = pij * (dot(doi, vj, d.D) - di) * scale;
          Acc *dkj = &dkb[col], *dvj = &dvb[col];
          for (int64_t c = 0; c < d.D; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
            dvj[c] += pij * doi[c];
          }
        }
      }
      store_block(dq, bh, d.T * d.D, dqb.data());
    }
    store_block(dk, bk, d.S * d.D, dkb.data());
    store_block(dv, bk, d.S * d.D, dvb.data());
  }
}

template <typename Acc>
void rope_impl(const Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse,
               const Tensor& addend) {
  const int64_t H = x.shape()[1], T = x.shape()[2], D = x.shape()[3], half = D / 2;
  const int64_t rows = x.numel() / D;
  const bool per_row = cos.dim() == 3;
  const float *cp = cos.data<float>(), *sp = sin.data<float>();
  const Acc sign = inverse ? Acc(-1) : Acc(1);
  const Strides &xs = x.strides(), &os = out.strides();
  const int64_t isz = static_cast<int64_t>(itemsize(x.dtype()));
  const char* xp = static_cast<const char*>(x.data_ptr());
  char* op = static_cast<char*>(out.data_ptr());
  const bool sum = addend.defined();
  const char* yp = sum ? static_cast<const char*>(addend.data_ptr()) : nullptr;
  const Strides ys = sum ? addend.strides() : xs;
#pragma omp parallel if (x.numel() >= kParallelGrain)
  {
    std::vector<Acc> in(static_cast<size_t>(D)), add(sum ? static_cast<size_t>(D) : 0), res(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / (H * T), h = r / T % H, t = r % T;
      load_strided<Acc>(x.dtype(), xp + (b * xs[0] + h * xs[1] + t * xs[2]) * isz, 1, D, in.data());
      if (sum) {
        load_strided<Acc>(addend.dtype(), yp + (b * ys[0] + h * ys[1] + t * ys[2]) * isz, 1, D, add.data());
        for (int64_t i = 0; i < D; ++i) in[i] += add[i];
      }
      const int64_t tt = (per_row ? b * T : 0) + t;
      const float *c = cp + tt * half, *s = sp + tt * half;
      for (int64_t i = 0; i < half; ++i) {
        const Acc x1 = in[i], x2 = in[i + half], ci = c[i], si = sign * s[i];
        res[i] = x1 * ci - x2 * si;
        res[i + half] = x2 * ci + x1 * si;
      }
      store_strided<Acc>(out.dtype(), op + (b * os[0] + h * os[1] + t * os[2]) * isz, 1, D, res.data());
    }
  }
}

void check_contiguous(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) INGOT_INTERNAL_CHECK(t->is_contiguous(), op, ": operands must be contiguous");
}

}  // namespace

void rope(const Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse,
          const Tensor& addend) {
  check_contiguous("rope", {&cos, &sin});
  INGOT_INTERNAL_CHECK(x.stride(3) == 1 && out.stride(3) == 1, "rope: x and out need a dense last dim");
  INGOT_INTERNAL_CHECK(cos.dtype() == DType::f32 && sin.dtype() == DType::f32, "rope: tables must be f32");
  INGOT_INTERNAL_CHECK(
      !addend.defined() || (addend.shape() == x.shape() && addend.dtype() == x.dtype() && addend.stride(3) == 1),
      "rope: the addend needs x's shape and dtype and a dense last dim");
  if (x.dtype() == DType::f64) rope_impl<double>(out, x, cos, sin, inverse, addend);
  else rope_impl<float>(out, x, cos, sin, inverse, addend);
}

// positions: undefined, or i64 [B, T] contiguous (the op layer converts).
void check_positions(const char* op, const Tensor& positions, const Tensor& q, bool causal) {
  if (!positions.defined()) return;
  INGOT_INTERNAL_CHECK(causal && positions.dtype() == DType::i64 && positions.is_contiguous() &&
                           positions.shape() == Shape({q.shape()[0], q.shape()[2]}),
                       op, ": positions must be contiguous i64 [B, T] with causal attention");
}

void attention_fwd(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& positions, bool causal, double scale) {
  check_contiguous("attention_fwd", {&out, &lse, &q, &k, &v});
  check_positions("attention_fwd", positions, q, causal);
  INGOT_INTERNAL_CHECK(lse.dtype() == DType::f32, "attention_fwd: lse must be f32");
  if (q.dtype() == DType::f64) attention_fwd_impl<double>(out, lse, q, k, v, positions, causal, scale);
  else attention_fwd_impl<float>(out, lse, q, k, v, positions, causal, static_cast<float>(scale));
}

void attention_bwd(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& positions,
                   bool causal, double scale) {
  check_contiguous("attention_bwd", {&dq, &dk, &dv, &dout, &q, &k, &v, &out, &lse});
  check_positions("attention_bwd", positions, q, causal);
  INGOT_INTERNAL_CHECK(lse.dtype() == DType::f32, "attention_bwd: lse must be f32");
  if (q.dtype() == DType::f64)
    attention_bwd_impl<double>(dq, dk, dv, dout, q, k, v, out, lse, positions, causal, scale);
  else attention_bwd_impl<float>(dq, dk, dv, dout, q, k, v, out, lse, positions, causal, static_cast<float>(scale));
}

}  // namespace ingot::kernels::cpu
