#include <cmath>

#include "testing.h"

#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

using testing::leaf;
using testing::randn_noncontig;

// Naive attention in f64 on host values: for every (b, h, i) the softmax of the masked scores row, then the
// weighted sum of v rows. q [B, Hq, T, D], k, v [B, Hkv, S, D].
std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  std::vector<double> qv = q.to_vector(), kv = k.to_vector(), vv = v.to_vector();
  std::vector<double> out(static_cast<size_t>(q.numel()), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(S, -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < S; ++j) {
          if (causal && j > i + (S - T)) continue;
          double d = 0;
          for (int64_t c = 0; c < D; ++c)
            d += qv[((b * Hq + h) * T + i) * D + c] * kv[((b * Hkv + hk) * S + j) * D + c];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        if (mx == -INFINITY) continue;  // no visible key: zeros
        double z = 0;
        for (int64_t j = 0; j < S; ++j) z += std::exp(s[j] - mx);
        for (int64_t j = 0; j < S; ++j) {
          const double p = std::exp(s[j] - mx) / z;
          for (int64_t c = 0; c < D; ++c)
            out[((b * Hq + h) * T + i) * D + c] += p * vv[((b * Hkv + hk) * S + j) * D + c];
        }
      }
    }
  return out;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

struct AttnCase {
  int64_t T, S;
  bool causal;
};
const AttnCase kCases[] = {{5, 5, true}, {5, 5, false}, {3, 7, true}, {3, 7, false}};

TEST(Attention, ForwardMatchesNaiveSoftmaxOfMaskedScores) {
  manual_seed(21);
  for (const AttnCase& c : kCases)
    for (DType dt : {DType::f32, DType::f64}) {
      SCOPED_TRACE(::testing::Message() << "T=" << c.T << " S=" << c.S << " causal=" << c.causal << " "
                                        << dtype_name(dt));
      Tensor q = randn({2, 4, c.T, 8}, dt), k = randn({2, 2, c.S, 8}, dt), v = randn({2, 2, c.S, 8}, dt);
      Tensor out = scaled_dot_product_attention(q, k, v, c.causal);
      EXPECT_EQ(out.shape(), q.shape());
      EXPECT_LT(max_abs_diff(out.to_vector(), naive_attention(q, k, v, c.causal, 1.0 / std::sqrt(8.0))),
                dt == DType::f64 ? 1e-12 : 1e-5);
    }
}

TEST(Attention, ExplicitScaleAndNonContiguousInputsAreHonoured) {
  manual_seed(22);
  Tensor q = randn_noncontig({1, 2, 4, 6}), k = randn_noncontig({1, 1, 4, 6}), v = randn({1, 1, 4, 6}, DType::f64);
  Tensor out = scaled_dot_product_attention(q, k, v, true, 0.3);
  EXPECT_LT(max_abs_diff(out.to_vector(), naive_attention(q, k, v, true, 0.3)), 1e-12);
}

TEST(Attention, GroupedQueryGradientsMatchFiniteDifferences) {
  manual_seed(23);
  for (const AttnCase& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.T << " S=" << c.S << " causal=" << c.causal);
    Tensor q = leaf(randn({2, 4, c.T, 8}, DType::f64));
    Tensor k = leaf(randn_noncontig({2, 2, c.S, 8}));
    Tensor v = leaf(randn({2, 2, c.S, 8}, DType::f64));
    const bool causal = c.causal;
    // lse is kept in f32 (as on the GPU); its ~1e-7 relative error stays inside the default tolerances.
    EXPECT_GRADCHECK(
        [causal](const std::vector<Tensor>& x) {
          return std::vector<Tensor>{scaled_dot_product_attention(x[0], x[1], x[2], causal)};
        },
        {q, k, v});
  }
}

// The same attention composed from differentiable ops: kv heads repeated with index_select, masked scores
// (where -inf), softmax, matmul. Valid when every query sees a key (T <= S or non-causal).
Tensor composed_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const int64_t Hq = q.size(1), T = q.size(2), S = k.size(2), group = Hq / k.size(1);
  std::vector<int64_t> head(Hq);
  for (int64_t h = 0; h < Hq; ++h) head[h] = h / group;
  Tensor kv_head = from_vector_i64(head, {Hq});
  Tensor kr = index_select(k, 1, kv_head), vr = index_select(v, 1, kv_head);
  Tensor scores = mul(matmul(q, transpose(kr, -1, -2)), 1.0 / std::sqrt(static_cast<double>(q.size(3))));
  if (causal) {
    std::vector<double> visible(T * S);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < S; ++j) visible[i * S + j] = j <= i + (S - T);
    Tensor mask = from_vector(visible, {T, S}, DType::b8);
    scores = where(mask, scores, full({}, -INFINITY, q.dtype()));
  }
  return matmul(softmax(scores, -1), vr);
}

TEST(Attention, ForwardAndGradientsMatchTheComposedSoftmaxOfMaskedScores) {
  manual_seed(30);
  for (const AttnCase& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.T << " S=" << c.S << " causal=" << c.causal);
    Tensor q0 = randn({2, 4, c.T, 8}, DType::f64), k0 = randn({2, 2, c.S, 8}, DType::f64);
    Tensor v0 = randn({2, 2, c.S, 8}, DType::f64), w = randn({2, 4, c.T, 8}, DType::f64);
    std::vector<std::vector<double>> results[2];
    for (int composed = 0; composed < 2; ++composed) {
      Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
      Tensor out = composed ? composed_attention(q, k, v, c.causal) : scaled_dot_product_attention(q, k, v, c.causal);
      sum(mul(out, w)).backward();
      results[composed] = {out.to_vector(), q.grad().to_vector(), k.grad().to_vector(), v.grad().to_vector()};
    }
    const char* what[] = {"out", "dq", "dk", "dv"};
    for (size_t i = 0; i < 4; ++i) EXPECT_LT(max_abs_diff(results[0][i], results[1][i]), 1e-6) << what[i];
  }
}

TEST(Attention, QueriesThatSeeNoKeyGiveZerosAndFiniteGradients) {
  manual_seed(24);
  // T > S with causal: the first T - S queries precede every key.
  Tensor q = leaf(randn({1, 2, 5, 4}, DType::f64)), k = leaf(randn({1, 1, 3, 4}, DType::f64));
  Tensor v = leaf(randn({1, 1, 3, 4}, DType::f64));
  Tensor out = scaled_dot_product_attention(q, k, v, true);
  std::vector<double> o = out.to_vector();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 2 * 4; ++i) EXPECT_EQ(o[h * 20 + i], 0.0);
  EXPECT_LT(max_abs_diff(o, naive_attention(q, k, v, true, 0.5)), 1e-12);
  sum(out).backward();
  for (const Tensor& t : {q, k, v})
    for (double g : t.grad().to_vector()) ASSERT_TRUE(std::isfinite(g));
}

TEST(Attention, Bf16AndF16FollowTheF32ResultWithinTheirPrecision) {
  manual_seed(25);
  Tensor q = randn({2, 4, 9, 16}), k = randn({2, 2, 9, 16}), v = randn({2, 2, 9, 16});
  Tensor ref = scaled_dot_product_attention(q, k, v, true);
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor out = scaled_dot_product_attention(cast(q, dt), cast(k, dt), cast(v, dt), true);
    EXPECT_EQ(out.dtype(), dt);
    EXPECT_LT(max_abs_diff(out.to_vector(), ref.to_vector()), dt == DType::bf16 ? 5e-2 : 5e-3);
  }
}

TEST(Attention, Bf16BackwardFollowsTheF32Gradients) {
  manual_seed(26);
  Tensor q = randn({1, 2, 6, 8}), k = randn({1, 1, 6, 8}), v = randn({1, 1, 6, 8}), w = randn({1, 2, 6, 8});
  std::vector<std::vector<double>> grads[2];
  for (int pass = 0; pass < 2; ++pass) {
    DType dt = pass == 0 ? DType::f32 : DType::bf16;
    Tensor qq = leaf(q.to(dt)), kk = leaf(k.to(dt)), vv = leaf(v.to(dt));
    sum(mul(scaled_dot_product_attention(qq, kk, vv, true), w.to(dt))).backward();
    for (const Tensor& t : {qq, kk, vv}) grads[pass].push_back(t.grad().to_vector());
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_LT(max_abs_diff(grads[0][i], grads[1][i]), 0.1) << "input " << i;
}

TEST(Attention, BadShapesNameTheOp) {
  auto msg = [](const Tensor& q, const Tensor& k, const Tensor& v) -> std::string {
    try {
      scaled_dot_product_attention(q, k, v);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(msg(zeros({1, 3, 4, 8}), zeros({1, 2, 4, 8}), zeros({1, 2, 4, 8}))
                .find("scaled_dot_product_attention: query heads (3) must be a multiple of kv heads (2)"),
            std::string::npos);
  EXPECT_NE(msg(zeros({1, 2, 4, 8}), zeros({1, 2, 4, 8}), zeros({1, 2, 5, 8})).find("k and v shapes differ"),
            std::string::npos);
  EXPECT_NE(msg(zeros({2, 4, 8}), zeros({2, 4, 8}), zeros({2, 4, 8})).find("must be [B, H, T, D]"),
            std::string::npos);
}

TEST(Rope, TablesFollowThetaPowerLawFromTheStartPosition) {
  auto [c, s] = rope_tables(6, 8, 10000.0, Device::cpu(), 3);
  EXPECT_EQ(c.shape(), (Shape{6, 4}));
  EXPECT_EQ(c.dtype(), DType::f32);
  std::vector<double> cv = c.to_vector(), sv = s.to_vector();
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t i = 0; i < 4; ++i) {
      const double angle = (3 + t) * std::pow(10000.0, -2.0 * i / 8);
      EXPECT_NEAR(cv[t * 4 + i], std::cos(angle), 1e-5);
      EXPECT_NEAR(sv[t * 4 + i], std::sin(angle), 1e-5);
    }
  // A later start is a slice of the longer table; given inv_freq replaces the power law.
  auto [c_all, s_all] = rope_tables(9, 8, 10000.0, Device::cpu());
  std::vector<double> all = c_all.to_vector();
  EXPECT_EQ(std::vector<double>(all.begin() + 12, all.end()), cv);
  auto [c2, s2] = rope_tables(2, 4, 0.0, Device::cpu(), 0, from_vector({0.5, 0.25}, {2}));
  EXPECT_NEAR(c2.to_vector()[3], std::cos(0.25), 1e-7);
}

TEST(Rope, RotatesPairsHalfADimApartAndPreservesTheirNorms) {
  manual_seed(27);
  const int64_t D = 8, T = 5;
  auto [c, s] = rope_tables(T, D, 500.0, Device::cpu());
  Tensor x = randn({2, 3, T, D}, DType::f64);
  Tensor y = rotary_embedding(x, c, s);
  std::vector<double> xv = x.to_vector(), yv = y.to_vector(), cv = c.to_vector(), sv = s.to_vector();
  for (int64_t r = 0; r < 2 * 3 * T; ++r)
    for (int64_t i = 0; i < D / 2; ++i) {
      const int64_t t = r % T;
      const double x1 = xv[r * D + i], x2 = xv[r * D + i + D / 2];
      const double y1 = yv[r * D + i], y2 = yv[r * D + i + D / 2];
      EXPECT_NEAR(y1, x1 * cv[t * 4 + i] - x2 * sv[t * 4 + i], 1e-12);
      EXPECT_NEAR(y2, x2 * cv[t * 4 + i] + x1 * sv[t * 4 + i], 1e-12);
      EXPECT_NEAR(y1 * y1 + y2 * y2, x1 * x1 + x2 * x2, 1e-6);  // tables are f32: |c^2 + s^2 - 1| ~ 1e-7
    }
  // Position 0 is the identity rotation.
  for (int64_t i = 0; i < D; ++i) EXPECT_DOUBLE_EQ(yv[i], xv[i]);
}

TEST(Rope, InverseRotationUndoesTheForward) {
  manual_seed(28);
  auto [c, s] = rope_tables(7, 16, 10000.0, Device::cpu(), 100);
  Tensor x = randn({1, 2, 7, 16});
  Tensor y = rotary_embedding(x, c, s), back = empty_like(x);
  kernels::cpu::rope(back, y, c, s, /*inverse=*/true, Tensor());
  EXPECT_LT(max_rel_error(back, x, 1e-5, 1e-6), 1.0);
}

TEST(Rope, GradientMatchesFiniteDifferences) {
  manual_seed(29);
  auto [c, s] = rope_tables(4, 6, 10000.0, Device::cpu());
  Tensor x = leaf(randn_noncontig({2, 3, 4, 6}));
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& v) { return std::vector<Tensor>{rotary_embedding(v[0], c, s)}; },
                   {x});
}

// Note [Rope keeps the token-major layout]: q or k seen as [B, H, T, D] over [B, T, H, D] memory (a projection's
// view, or a slice of a fused qkv projection) rotate through their strides, into a token-major result whose
// transpose back to [B, T, H, D] is a view; the values are those of the contiguous input, bit for bit.
TEST(Rope, TokenMajorInputsGiveTokenMajorResultsEqualToContiguousOnes) {
  manual_seed(31);
  const int64_t B = 2, T = 5, H = 3, D = 8;
  auto [c, s] = rope_tables(T, D, 10000.0, Device::cpu(), 3);
  auto exact = [](const Tensor& a, const Tensor& b) { return sum(abs(sub(a, b))).item() == 0.0; };
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor proj = randn({B, T, H * D}, DType::f64).to(dt);
    const Tensor x = transpose(reshape(proj, {B, T, H, D}), 1, 2);
    ASSERT_FALSE(x.is_contiguous());
    const Tensor y = rotary_embedding(x, c, s);
    EXPECT_TRUE(exact(y, rotary_embedding(contiguous(x), c, s)));
    EXPECT_EQ(y.stride(1), D) << "token-major result";
    EXPECT_TRUE(transpose(y, 1, 2).is_contiguous());
    // The k of a fused [q | k | v] projection: strides {T * 3HD, D, 3HD, 1} at an offset, into a dense result.
    const Tensor qkv = randn({B, T, 3 * H * D}, DType::f64).to(dt);
    const Tensor k = transpose(reshape(narrow(qkv, 2, H * D, H * D), {B, T, H, D}), 1, 2);
    const Tensor yk = rotary_embedding(k, c, s);
    EXPECT_TRUE(exact(yk, rotary_embedding(contiguous(k), c, s)));
    EXPECT_TRUE(transpose(yk, 1, 2).is_contiguous());
    // Per-row tables (packed documents) through the same strides.
    const Tensor pos = from_vector(std::vector<double>{0, 1, 2, 0, 1, 4, 3, 2, 1, 0}, {B, T}, DType::i64);
    const Tensor pc = embedding(c, pos), ps = embedding(s, pos);
    EXPECT_TRUE(exact(rotary_embedding(x, pc, ps), rotary_embedding(contiguous(x), pc, ps)));
  }
  // A contiguous [B, H, T, D] input keeps giving a contiguous result.
  EXPECT_TRUE(rotary_embedding(randn({B, H, T, D}), c, s).is_contiguous());
}

TEST(Rope, GradientThroughATokenMajorViewMatchesFiniteDifferences) {
  manual_seed(32);
  auto [c, s] = rope_tables(4, 6, 10000.0, Device::cpu());
  Tensor p = leaf(randn({2, 4, 3 * 6}, DType::f64));
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& v) {
        return std::vector<Tensor>{rotary_embedding(transpose(reshape(v[0], {2, 4, 3, 6}), 1, 2), c, s)};
      },
      {p});
}

// Note [Rope of a sum]: rope(x, addend) rotates x + addend summed in the accumulation type and rounds once: in bf16
// exactly the f32 rotation of the f32 sum, rounded.
TEST(Rope, OfASumRotatesTheSumInF32AndRoundsOnce) {
  manual_seed(33);
  const int64_t B = 2, T = 5, H = 3, D = 8;
  auto [c, s] = rope_tables(T, D, 10000.0, Device::cpu(), 2);
  auto exact = [](const Tensor& a, const Tensor& b) {
    return sum(abs(sub(a.to(DType::f64), b.to(DType::f64)))).item() == 0.0;
  };
  for (DType dt : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    // A LoRA projection's two summands, seen as heads (token-major views of [B, T, H * D]).
    const Tensor base = randn({B, T, H * D}).to(dt), delta = mul(randn({B, T, H * D}), 0.01).to(dt);
    auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, H, D}), 1, 2); };
    const Tensor y = rotary_embedding(heads(base), c, s, heads(delta));
    const Tensor want = rotary_embedding(heads(add(base.to(DType::f32), delta.to(DType::f32))), c, s).to(dt);
    EXPECT_TRUE(exact(y, want));
    EXPECT_EQ(y.stride(1), D) << "token-major result, as without an addend";
    // An addend laid out otherwise (contiguous [B, H, T, D]) gives the same values.
    EXPECT_TRUE(exact(rotary_embedding(heads(base), c, s, contiguous(heads(delta))), want));
    // Per-row tables (packed documents with LoRA adapters).
    const Tensor pos = from_vector(std::vector<double>{0, 1, 2, 0, 1, 4, 3, 2, 1, 0}, {B, T}, DType::i64);
    const Tensor pc = embedding(c, pos), ps = embedding(s, pos);
    EXPECT_TRUE(exact(rotary_embedding(heads(base), pc, ps, heads(delta)),
                      rotary_embedding(heads(add(base.to(DType::f32), delta.to(DType::f32))), pc, ps).to(dt)));
  }
}

// Why the sum is taken inside the rotation: a bf16 base plus a delta below half its ulp rounds back to the base, so
// rotating the rounded sum loses the delta entirely (an adapter's first updates, B ~ lr); rotated in f32 and rounded
// once, the delta survives on average: the change of the result, projected on rope(delta), is nearly rope(delta).
TEST(Rope, ADeltaBelowHalfAnUlpOfTheBaseSurvivesTheRotationOnAverage) {
  manual_seed(34);
  const int64_t T = 64, D = 64;
  auto [c, s] = rope_tables(T, D, 10000.0, Device::cpu());
  const Tensor base = randn({1, 4, T, D}).to(DType::bf16);
  const Tensor delta = mul(base.to(DType::f32), 1.0 / 1024).to(DType::bf16);  // |delta| < ulp(base) / 2 everywhere
  ASSERT_EQ(sum(abs(sub(add(base, delta), base).to(DType::f64))).item(), 0.0) << "the bf16 sum is the base";
  const Tensor plain = rotary_embedding(base, c, s).to(DType::f64);
  const Tensor rd = rotary_embedding(delta.to(DType::f64), c, s);
  auto along_delta = [&](const Tensor& y) {
    return sum(mul(sub(y.to(DType::f64), plain), rd)).item() / sum(mul(rd, rd)).item();
  };
  // ~0.92: pairs of low frequency at early positions rotate by so little that their results stay near bf16 values,
  // where the delta is lost again; everywhere else it survives.
  const double kept = along_delta(rotary_embedding(base, c, s, delta));
  EXPECT_GT(kept, 0.8);
  EXPECT_LT(kept, 1.1);
  EXPECT_EQ(along_delta(rotary_embedding(add(base, delta), c, s)), 0.0);
}

TEST(Rope, GradientOfASumMatchesFiniteDifferences) {
  manual_seed(35);
  auto [c, s] = rope_tables(4, 6, 10000.0, Device::cpu());
  Tensor x = leaf(randn_noncontig({2, 3, 4, 6})), y = leaf(randn({2, 3, 4, 6}, DType::f64));
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& v) { return std::vector<Tensor>{rotary_embedding(v[0], c, s, v[1])}; }, {x, y});
}

TEST(Rope, AMismatchedAddendNamesTheOp) {
  auto [c, s] = rope_tables(4, 8, 10000.0, Device::cpu());
  try {
    rotary_embedding(zeros({1, 1, 4, 8}), c, s, zeros({1, 2, 4, 8}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rotary_embedding: the addend must match x"), std::string::npos) << e.what();
  }
}

TEST(Rope, MismatchedTablesNameTheOp) {
  auto [c, s] = rope_tables(4, 8, 10000.0, Device::cpu());
  try {
    rotary_embedding(zeros({1, 1, 5, 8}), c, s);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rotary_embedding: cos/sin must be [5, 4]"), std::string::npos)
        << e.what();
  }
}

// Packed documents (issue 24). Row 0 holds documents of 3, 4 and 2 tokens; row 1 the tail of a document begun in
// an earlier row (its positions restart at the row's first token) and a document of 5 tokens.
Tensor packed_positions() {
  return from_vector({0, 1, 2, 0, 1, 2, 3, 0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4}, {2, 9}, DType::i64);
}
struct Doc {
  int64_t row, start, len;
};
const Doc kDocs[] = {{0, 0, 3}, {0, 3, 4}, {0, 7, 2}, {1, 0, 4}, {1, 4, 5}};

// Tokens [start, start + len) of batch row `row` of x [B, H, T, D].
Tensor doc_slice(const Tensor& x, const Doc& d) { return narrow(narrow(x, 0, d.row, 1), 2, d.start, d.len); }

TEST(Attention, PackedDocumentsEqualEachDocumentAloneForwardAndBackward) {
  manual_seed(30);
  for (DType dt : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor q = leaf(randn({2, 4, 9, 8}, dt)), k = leaf(randn({2, 2, 9, 8}, dt)), v = leaf(randn({2, 2, 9, 8}, dt));
    Tensor w = randn({2, 4, 9, 8}, dt);
    Tensor out = scaled_dot_product_attention(q, k, v, true, std::nullopt, packed_positions());
    sum(mul(out, w)).backward();
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    for (const Doc& d : kDocs) {
      SCOPED_TRACE(::testing::Message() << "row " << d.row << " tokens " << d.start << "+" << d.len);
      Tensor qd = leaf(doc_slice(q, d).detach().contiguous_raw()), kd = leaf(doc_slice(k, d).detach().contiguous_raw()),
             vd = leaf(doc_slice(v, d).detach().contiguous_raw());
      Tensor alone = scaled_dot_product_attention(qd, kd, vd, true);
      sum(mul(alone, doc_slice(w, d))).backward();
      EXPECT_LT(max_abs_diff(doc_slice(out, d).contiguous_raw().to_vector(), alone.to_vector()), tol);
      EXPECT_LT(max_abs_diff(doc_slice(q.grad(), d).contiguous_raw().to_vector(), qd.grad().to_vector()), tol);
      EXPECT_LT(max_abs_diff(doc_slice(k.grad(), d).contiguous_raw().to_vector(), kd.grad().to_vector()), tol);
      EXPECT_LT(max_abs_diff(doc_slice(v.grad(), d).contiguous_raw().to_vector(), vd.grad().to_vector()), tol);
    }
    // Without positions a later document attends to the earlier ones: the comparison above can fail.
    NoGradGuard no_grad;
    Tensor unmasked = scaled_dot_product_attention(q, k, v, true);
    Tensor second = scaled_dot_product_attention(doc_slice(q, kDocs[1]).contiguous_raw(),
                                                 doc_slice(k, kDocs[1]).contiguous_raw(),
                                                 doc_slice(v, kDocs[1]).contiguous_raw(), true);
    EXPECT_GT(max_abs_diff(doc_slice(unmasked, kDocs[1]).contiguous_raw().to_vector(), second.to_vector()), 1e-2);
  }
}

TEST(Attention, PackedDocumentGradientsMatchFiniteDifferences) {
  manual_seed(31);
  Tensor q = leaf(randn({2, 4, 9, 8}, DType::f64)), k = leaf(randn_noncontig({2, 2, 9, 8}));
  Tensor v = leaf(randn({2, 2, 9, 8}, DType::f64));
  const Tensor pos = packed_positions();
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& x) {
        return std::vector<Tensor>{scaled_dot_product_attention(x[0], x[1], x[2], true, std::nullopt, pos)};
      },
      {q, k, v});
}

TEST(Attention, PositionsNeedCausalAttentionAndOneRowPerBatch) {
  Tensor q = randn({2, 1, 9, 4}, DType::f32);
  auto expect_error = [&](bool causal, const Tensor& pos, const std::string& needle) {
    try {
      scaled_dot_product_attention(q, q, q, causal, std::nullopt, pos);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(false, packed_positions(), "positions (packed documents) need causal attention");
  expect_error(true, zeros({2, 8}, DType::i64), "positions must be an integer [B, T] = [2, 9]");
  expect_error(true, zeros({2, 9}, DType::f32), "positions must be an integer [B, T] = [2, 9]");
}

// Per-row tables [B, T, D/2]: the table rows at each token's position, what a packed row's RoPE uses.
TEST(Rope, PerRowTablesRotateEachRowByItsOwnPositions) {
  manual_seed(32);
  auto [c, s] = rope_tables(9, 8, 10000.0, Device::cpu());
  const Tensor pos = packed_positions();
  Tensor x = randn({2, 3, 9, 8}, DType::f64);
  Tensor y = rotary_embedding(x, embedding(c, pos), embedding(s, pos));
  for (const Doc& d : kDocs) {
    auto [cd, sd] = rope_tables(d.len, 8, 10000.0, Device::cpu());
    Tensor alone = rotary_embedding(doc_slice(x, d).contiguous_raw(), cd, sd);
    EXPECT_LT(max_abs_diff(doc_slice(y, d).contiguous_raw().to_vector(), alone.to_vector()), 1e-12)
        << "row " << d.row << " tokens " << d.start << "+" << d.len;
  }
  Tensor xl = leaf(randn_noncontig({2, 3, 9, 8}));
  Tensor cr = embedding(c, pos), sr = embedding(s, pos);
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& v) { return std::vector<Tensor>{rotary_embedding(v[0], cr, sr)}; },
                   {xl});
}

}  // namespace
}  // namespace ingot
