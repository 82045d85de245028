// CUDA rope and attention kernels against the CPU kernels of the same name, on fresh random inputs, in every
// float dtype, with grouped-query heads, causal masks with T == S, T < S and T > S (rows that see no key), and
// head dims that are not multiples of 32, into NaN-poisoned outputs, and packed documents (positions restarting
// at random boundaries per row, issue 24). The attention implementation is picked by INGOT_ATTENTION
// (cudnn | fallback | auto); the tests set it per case and restore it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "runtime/kernels/kernels.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/testing.h"

namespace ingot::testing {
namespace {

namespace kc = kernels::cpu;
namespace kg = kernels::cuda;

const Device kGpu = Device::cuda(0);

// As in test_cuda_rowwise.cpp: atol is relative to max(max|ref|, 1), the scale of the unit-scale inputs'
// products. Attention sums over S keys and D channels in another order (and, for 16-bit inputs, cuDNN keeps P
// and dS in 16 bits for its matrix products).
double attn_tol(DType t) {
  switch (t) {
    case DType::f32: return 1e-4;
    case DType::f64: return 1e-6;  // lse is f32 on both sides, and may round differently
    case DType::bf16: return 2.5e-2;
    case DType::f16: return 5e-3;
    default: return 0;
  }
}

::testing::AssertionResult close(const Tensor& out, const Tensor& ref, double tol) {
  std::vector<double> a = out.to_vector(), b = ref.to_vector();
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  double scale = 1.0;
  for (double v : b)
    if (std::isfinite(v)) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;  // also -inf == -inf (lse of a row that sees no key)
    if (!(std::abs(a[i] - b[i]) <= tol * (std::abs(b[i]) + scale)))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i] << " (tol " << tol
                                           << ", max |ref| " << scale << ")";
  }
  return ::testing::AssertionSuccess();
}

Operand rand_operand(const Shape& s, DType dt, double scale = 1.0) {
  return make_operand(s, dt, Layout::Contiguous, [scale](double x) { return scale * x; });
}

// Sets INGOT_ATTENTION for one scope and restores the previous value.
class AttentionImpl {
 public:
  explicit AttentionImpl(const char* value) {
    if (const char* old = std::getenv("INGOT_ATTENTION")) old_ = old;
    setenv("INGOT_ATTENTION", value, 1);
  }
  ~AttentionImpl() {
    if (old_) setenv("INGOT_ATTENTION", old_->c_str(), 1);
    else unsetenv("INGOT_ATTENTION");
  }

 private:
  std::optional<std::string> old_;
};

struct AttnCase {
  int64_t B, Hq, Hkv, T, S, D;
  bool causal;
};

std::string case_str(const AttnCase& c, DType dt) {
  return detail::str_cat(dtype_name(dt), " B", c.B, " Hq", c.Hq, " Hkv", c.Hkv, " T", c.T, " S", c.S, " D", c.D,
                         c.causal ? " causal" : "");
}

// Runs forward and backward on both devices and compares every output. Both backward passes read the CPU
// forward's out and lse, so a forward error does not hide in the backward comparison. positions: CPU i64 [B, T]
// (packed documents) or undefined.
void check_attention(const AttnCase& c, DType dt, const Tensor& positions = Tensor()) {
  const Shape qs{c.B, c.Hq, c.T, c.D}, ks{c.B, c.Hkv, c.S, c.D}, ls{c.B, c.Hq, c.T};
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  Operand q = rand_operand(qs, dt), k = rand_operand(ks, dt), v = rand_operand(ks, dt), dout = rand_operand(qs, dt);
  Tensor out_ref = empty(qs, dt), lse_ref = empty(ls, DType::f32);
  const Tensor pos_gpu = positions.defined() ? positions.to(kGpu) : Tensor();
  kc::attention_fwd(out_ref, lse_ref, q.cpu, k.cpu, v.cpu, positions, c.causal, scale);
  Tensor out = poisoned(qs, dt, kGpu), lse = poisoned(ls, DType::f32, kGpu);
  kg::attention_fwd(out, lse, q.gpu, k.gpu, v.gpu, pos_gpu, c.causal, scale);
  const std::string at = case_str(c, dt) + (positions.defined() ? " packed" : "");
  const double tol = attn_tol(dt);
  EXPECT_TRUE(close(out, out_ref, tol)) << "out " << at;
  EXPECT_TRUE(close(lse, lse_ref, attn_tol(DType::f32))) << "lse " << at;

  Tensor dq_ref = empty(qs, dt), dk_ref = empty(ks, dt), dv_ref = empty(ks, dt);
  kc::attention_bwd(dq_ref, dk_ref, dv_ref, dout.cpu, q.cpu, k.cpu, v.cpu, out_ref, lse_ref, positions, c.causal,
                    scale);
  Tensor dq = poisoned(qs, dt, kGpu), dk = poisoned(ks, dt, kGpu), dv = poisoned(ks, dt, kGpu);
  kg::attention_bwd(dq, dk, dv, dout.gpu, q.gpu, k.gpu, v.gpu, out_ref.to(kGpu), lse_ref.to(kGpu), pos_gpu, c.causal,
                    scale);
  EXPECT_TRUE(close(dq, dq_ref, tol)) << "dq " << at;
  EXPECT_TRUE(close(dk, dk_ref, tol)) << "dk " << at;
  EXPECT_TRUE(close(dv, dv_ref, tol)) << "dv " << at;
}

const AttnCase kFallbackCases[] = {
    {1, 1, 1, 1, 1, 8, false},    {2, 4, 2, 17, 17, 64, true},  {2, 4, 2, 17, 17, 64, false},
    {1, 2, 1, 5, 13, 32, true},   {1, 2, 2, 13, 5, 16, true},   {1, 3, 1, 33, 40, 80, true},
    {1, 2, 1, 70, 70, 128, true}, {1, 1, 1, 9, 11, 7, false},   {1, 2, 2, 12, 12, 256, true},
};

TEST(CudaAttention, FallbackForwardAndBackwardMatchCpuInEveryDType) {
  INGOT_REQUIRE_CUDA();
  AttentionImpl impl("fallback");
  manual_seed(201);
  for (DType dt : kFloatDTypes)
    for (const AttnCase& c : kFallbackCases) check_attention(c, dt);
}

// cuDNN's fused attention takes bf16 / f16 with D <= 128 (a multiple of 8), causal only with T == S; auto uses it
// there and falls back elsewhere (the last case), so this checks whichever ran against the CPU. Few cases:
// each new shape builds two cuDNN plans (~0.3 s each).
struct FusedCase {
  AttnCase c;
  DType dt;
};
const FusedCase kFusedCases[] = {
    {{2, 4, 2, 64, 64, 64, true}, DType::bf16},
    {{1, 4, 4, 100, 100, 128, true}, DType::f16},
    {{1, 2, 1, 40, 56, 72, false}, DType::bf16},
    {{1, 2, 2, 16, 48, 32, true}, DType::f16},
};

TEST(CudaAttention, AutoSelectedImplementationMatchesCpuFor16BitInputs) {
  INGOT_REQUIRE_CUDA();
  AttentionImpl impl("auto");
  manual_seed(202);
  for (const FusedCase& f : kFusedCases) check_attention(f.c, f.dt);
}

// Forces cuDNN (forward and backward): fails if the installed cuDNN cannot build a fused graph, which auto mode
// would hide by falling back.
TEST(CudaAttention, CudnnFusedForwardAndBackwardMatchCpuWhereSupported) {
  INGOT_REQUIRE_CUDA();
  AttentionImpl impl("cudnn");
  manual_seed(204);
  for (const FusedCase& f : kFusedCases)
    if (!f.c.causal || f.c.T == f.c.S) check_attention(f.c, f.dt);
}

// Positions of packed rows: each token starts a new document with probability 1/6 (the first always does).
Tensor packed_positions(int64_t B, int64_t T, uint64_t seed) {
  std::vector<double> pos;
  uint64_t state = seed;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      pos.push_back(t == 0 || (state >> 33) % 6 == 0 ? 0.0 : pos.back() + 1);
    }
  return from_vector(pos, {B, T}, DType::i64);
}

// Issue 24: attention masked to each query's document. auto must not hand the call to cuDNN (which would attend
// across documents) and cudnn must refuse it; both sides read the same positions.
TEST(CudaAttention, PackedDocumentsMatchTheCpuKernelInEveryDType) {
  INGOT_REQUIRE_CUDA();
  manual_seed(206);
  const AttnCase cases[] = {{2, 4, 2, 70, 70, 64, true}, {1, 2, 1, 33, 33, 32, true}, {2, 2, 2, 17, 29, 16, true},
                            {1, 4, 4, 100, 100, 128, true}};
  for (const char* impl_name : {"auto", "fallback"}) {
    AttentionImpl impl(impl_name);
    for (DType dt : kFloatDTypes)
      for (const AttnCase& c : cases) check_attention(c, dt, packed_positions(c.B, c.T, 7 + c.T));
  }
  AttentionImpl impl("cudnn");
  Operand q = rand_operand({1, 1, 8, 16}, DType::bf16);
  Tensor out = poisoned({1, 1, 8, 16}, DType::bf16, kGpu), lse = poisoned({1, 1, 8}, DType::f32, kGpu);
  try {
    kg::attention_fwd(out, lse, q.gpu, q.gpu, q.gpu, packed_positions(1, 8, 3).to(kGpu), true, 0.25);
    FAIL() << "expected INGOT_ATTENTION=cudnn to refuse packed documents";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("packed documents"), std::string::npos) << e.what();
  }
}

// Note [Attention layouts]: q, k, v as views of one [B, T, 3, H, W] projection output (W = D + pad) and out,
// dout, dq, dk, dv in [B, T, H, D] memory order, the layouts a GPT block hands attention. pad 0: cuDNN reads and
// writes them in place; pad 1: strides that are not multiples of 8, so the kernels run on contiguous copies and
// the results are copied into the strided outputs. Every output must equal the CPU result on dense copies.
void check_strided(int64_t B, int64_t H, int64_t T, int64_t D, int64_t pad, DType dt) {
  const int64_t W = D + pad;
  const Shape qs{B, H, T, D}, ls{B, H, T};
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Operand packed = rand_operand({B, T, 3, H, W}, dt), dout_btd = rand_operand({B, T, H, D}, dt);
  auto qkv = [&](const Tensor& t, int which) {
    return t.as_strided(qs, {T * 3 * H * W, W, 3 * H * W, 1}, t.offset() + which * H * W);
  };
  auto bthd = [&](const Tensor& t) { return t.as_strided(qs, {T * H * D, D, H * D, 1}, t.offset()); };
  const Tensor q = qkv(packed.gpu, 0), k = qkv(packed.gpu, 1), v = qkv(packed.gpu, 2), dout = bthd(dout_btd.gpu);
  const Tensor qc = qkv(packed.cpu, 0).contiguous_raw(), kc = qkv(packed.cpu, 1).contiguous_raw(),
               vc = qkv(packed.cpu, 2).contiguous_raw(), doutc = bthd(dout_btd.cpu).contiguous_raw();
  Tensor out_ref = empty(qs, dt), lse_ref = empty(ls, DType::f32);
  kc::attention_fwd(out_ref, lse_ref, qc, kc, vc, Tensor(), true, scale);
  Tensor out = bthd(poisoned({B, T, H, D}, dt, kGpu)), lse = poisoned(ls, DType::f32, kGpu);
  kg::attention_fwd(out, lse, q, k, v, Tensor(), true, scale);
  const std::string at = detail::str_cat(dtype_name(dt), " B", B, " H", H, " T", T, " D", D, " pad ", pad);
  const double tol = attn_tol(dt);
  EXPECT_TRUE(close(out.contiguous_raw(), out_ref, tol)) << "out " << at;
  EXPECT_TRUE(close(lse, lse_ref, attn_tol(DType::f32))) << "lse " << at;

  Tensor dq_ref = empty(qs, dt), dk_ref = empty(qs, dt), dv_ref = empty(qs, dt);
  kc::attention_bwd(dq_ref, dk_ref, dv_ref, doutc, qc, kc, vc, out_ref, lse_ref, Tensor(), true, scale);
  Tensor dq = bthd(poisoned({B, T, H, D}, dt, kGpu)), dk = bthd(poisoned({B, T, H, D}, dt, kGpu)),
         dv = bthd(poisoned({B, T, H, D}, dt, kGpu));
  kg::attention_bwd(dq, dk, dv, dout, q, k, v, out, lse, Tensor(), true, scale);
  EXPECT_TRUE(close(dq.contiguous_raw(), dq_ref, tol)) << "dq " << at;
  EXPECT_TRUE(close(dk.contiguous_raw(), dk_ref, tol)) << "dk " << at;
  EXPECT_TRUE(close(dv.contiguous_raw(), dv_ref, tol)) << "dv " << at;
}

TEST(CudaAttention, StridedProjectionLayoutsMatchCpuInPlaceAndThroughCopies) {
  INGOT_REQUIRE_CUDA();
  manual_seed(205);
  for (const char* impl_name : {"auto", "fallback"}) {
    AttentionImpl impl(impl_name);
    for (int64_t pad : {0, 1}) {
      check_strided(2, 3, 40, 64, pad, DType::bf16);
      check_strided(1, 2, 17, 32, pad, DType::f16);
    }
    check_strided(1, 2, 9, 16, 0, DType::f32);
  }
}

TEST(CudaAttention, CudnnSelectionRejectsUnsupportedDTypesWithAClearError) {
  INGOT_REQUIRE_CUDA();
  AttentionImpl impl("cudnn");
  Operand q = rand_operand({1, 1, 4, 8}, DType::f64);
  Tensor out = poisoned({1, 1, 4, 8}, DType::f64, kGpu), lse = poisoned({1, 1, 4}, DType::f32, kGpu);
  try {
    kg::attention_fwd(out, lse, q.gpu, q.gpu, q.gpu, Tensor(), false, 0.5);
    FAIL() << "expected an error for f64 under INGOT_ATTENTION=cudnn";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("INGOT_ATTENTION=cudnn"), std::string::npos) << e.what();
  }
}

TEST(CudaRope, ForwardAndInverseMatchCpuAndWorkInPlace) {
  INGOT_REQUIRE_CUDA();
  manual_seed(203);
  // D = 8, 64, 128: the vectorized path (half a multiple of 16 bytes); D = 2, 6: the scalar one.
  const Shape shapes[] = {{1, 1, 1, 2}, {2, 3, 5, 8}, {1, 4, 17, 64}, {2, 2, 33, 6}, {2, 3, 37, 128}};
  for (DType dt : kFloatDTypes) {
    for (const Shape& s : shapes) {
      const int64_t T = s[2], half = s[3] / 2;
      Operand x = rand_operand(s, dt);
      Operand theta = rand_operand({T, half}, DType::f64, 3.0);
      std::vector<double> th = theta.cpu.to_vector(), cv, sv;
      for (double t : th) {
        cv.push_back(std::cos(t));
        sv.push_back(std::sin(t));
      }
      Tensor cos = from_vector(cv, {T, half}, DType::f32), sin = from_vector(sv, {T, half}, DType::f32);
      for (bool inverse : {false, true}) {
        Tensor ref = empty(s, dt), out = poisoned(s, dt, kGpu);
        kc::rope(ref, x.cpu, cos, sin, inverse, Tensor());
        kg::rope(out, x.gpu, cos.to(kGpu), sin.to(kGpu), inverse, Tensor());
        const std::string at = detail::str_cat(dtype_name(dt), " ", shape_str(s), inverse ? " inverse" : "");
        Tol t = tol_for(dt);
        EXPECT_LE(max_rel_error(out, ref, t.rtol, 10 * t.atol), 1.0) << at;
        Tensor inplace = x.gpu.clone_raw();
        kg::rope(inplace, inplace, cos.to(kGpu), sin.to(kGpu), inverse, Tensor());
        EXPECT_EQ(count_unequal(inplace, out), 0) << "in place " << at;
      }
    }
  }
}

// Token-major operands (Note [Rope keeps the token-major layout]): x seen as [B, H, T, D] over [B, T, H, D] memory,
// or over a slice of a fused qkv row (an offset, a wider row stride), into a token-major out: the GPU kernels read
// and write through the strides (vectorized where every row start is 16-byte aligned, else the scalar kernel)
// and match the CPU kernel on the contiguous copy.
TEST(CudaRope, TokenMajorOperandsMatchCpuThroughTheirStrides) {
  INGOT_REQUIRE_CUDA();
  manual_seed(205);
  for (DType dt : kFloatDTypes) {
    for (const int64_t D : {6, 8, 128}) {
      const int64_t B = 2, T = 9, H = 3, half = D / 2;
      Operand theta = rand_operand({T, half}, DType::f64, 3.0);
      std::vector<double> cv, sv;
      for (double t : theta.cpu.to_vector()) {
        cv.push_back(std::cos(t));
        sv.push_back(std::sin(t));
      }
      Tensor cos = from_vector(cv, {T, half}, DType::f32), sin = from_vector(sv, {T, half}, DType::f32);
      // slot 0: a projection [B, T, H * D]; slot 1: the k of a fused [B, T, 3 * H * D] row; slot 2: the same one
      // element further (misaligned: the scalar kernel).
      for (int slot = 0; slot < 3; ++slot) {
        const int64_t width = slot == 0 ? H * D : 3 * H * D, off = slot == 0 ? 0 : H * D + (slot == 2 ? 1 : 0);
        Operand row = rand_operand({B, T, width + 1}, dt);
        auto view = [&](const Tensor& t) {
          return t.as_strided({B, H, T, D}, {T * (width + 1), D, width + 1, 1}, off);
        };
        const Tensor x_cpu = view(row.cpu), x_gpu = view(row.gpu);
        for (bool inverse : {false, true}) {
          Tensor ref = empty({B, H, T, D}, dt);
          kc::rope(ref, x_cpu.contiguous_raw(), cos, sin, inverse, Tensor());
          Tensor out = poisoned({B, T, H, D}, dt, kGpu).as_strided({B, H, T, D}, {T * H * D, D, H * D, 1}, 0);
          kg::rope(out, x_gpu, cos.to(kGpu), sin.to(kGpu), inverse, Tensor());
          const std::string at = detail::str_cat(dtype_name(dt), " D ", D, " slot ", slot, inverse ? " inverse" : "");
          Tol t = tol_for(dt);
          EXPECT_LE(max_rel_error(out.contiguous_raw(), ref, t.rtol, 10 * t.atol), 1.0) << at;
        }
      }
    }
  }
}

// Note [Rope of a sum] (autograd/ops/attention.cpp): x + addend rotated, the addend read with x's strides, on the
// vectorized path (token-major over a projection, aligned), the scalar one (D = 6, and rows one element longer), with
// shared and per-row tables, and in place over x; against the CPU kernel, which sums in f32 too.
TEST(CudaRope, OfASumMatchesCpuOnEveryPath) {
  INGOT_REQUIRE_CUDA();
  manual_seed(209);
  for (DType dt : kFloatDTypes) {
    for (const int64_t D : {6, 128}) {
      for (const int64_t off : {0, 1}) {
        for (const bool per_row : {false, true}) {  // per-row tables [B, T, D/2]: packed documents
          // Rows of H * D elements (16-byte aligned for D = 128: the vectorized kernel), or one more (the scalar one).
          const int64_t B = 2, T = 9, H = 3, half = D / 2, width = H * D + off;
          std::vector<double> cv, sv;
          Operand theta_rows = rand_operand({(per_row ? B : 1) * T, half}, DType::f64, 3.0);
          for (double t : theta_rows.cpu.to_vector()) {
            cv.push_back(std::cos(t));
            sv.push_back(std::sin(t));
          }
          const Shape ts = per_row ? Shape{B, T, half} : Shape{T, half};
          Tensor cos = from_vector(cv, ts, DType::f32), sin = from_vector(sv, ts, DType::f32);
          Operand xrow = rand_operand({B, T, width}, dt), yrow = rand_operand({B, T, width}, dt);
          auto view = [&](const Tensor& t) { return t.as_strided({B, H, T, D}, {T * width, D, width, 1}, off); };
          for (bool inverse : {false, true}) {
            Tensor ref = empty({B, H, T, D}, dt);
            kc::rope(ref, view(xrow.cpu).contiguous_raw(), cos, sin, inverse, view(yrow.cpu).contiguous_raw());
            Tensor out = poisoned({B, T, H, D}, dt, kGpu).as_strided({B, H, T, D}, {T * H * D, D, H * D, 1}, 0);
            kg::rope(out, view(xrow.gpu), cos.to(kGpu), sin.to(kGpu), inverse, view(yrow.gpu));
            const std::string at = detail::str_cat(dtype_name(dt), " D ", D, " offset ", off, per_row ? " per row" : "",
                                                   inverse ? " inverse" : "");
            Tol t = tol_for(dt);
            EXPECT_LE(max_rel_error(out.contiguous_raw(), ref, t.rtol, 10 * t.atol), 1.0) << at;
            Tensor inplace = xrow.gpu.clone_raw();
            kg::rope(view(inplace), view(inplace), cos.to(kGpu), sin.to(kGpu), inverse, view(yrow.gpu));
            EXPECT_LE(max_rel_error(view(inplace).contiguous_raw(), ref, t.rtol, 10 * t.atol), 1.0)
                << "in place " << at;
          }
        }
      }
    }
  }
}

// Per-row tables [B, T, D/2]: packed documents rotate each row's tokens by their own positions.
TEST(CudaRope, PerRowTablesMatchCpu) {
  INGOT_REQUIRE_CUDA();
  manual_seed(207);
  for (const Shape& s : {Shape{2, 3, 9, 8}, Shape{2, 3, 9, 128}}) {  // the scalar and the vectorized paths
    const int64_t half = s[3] / 2;
    Operand theta = rand_operand({2, 9, half}, DType::f64, 3.0);
    std::vector<double> cv, sv;
    for (double t : theta.cpu.to_vector()) {
      cv.push_back(std::cos(t));
      sv.push_back(std::sin(t));
    }
    Tensor cos = from_vector(cv, {2, 9, half}, DType::f32), sin = from_vector(sv, {2, 9, half}, DType::f32);
    for (DType dt : kFloatDTypes) {
      Operand x = rand_operand(s, dt);
      Tensor ref = empty(s, dt), out = poisoned(s, dt, kGpu);
      kc::rope(ref, x.cpu, cos, sin, false, Tensor());
      kg::rope(out, x.gpu, cos.to(kGpu), sin.to(kGpu), false, Tensor());
      Tol t = tol_for(dt);
      EXPECT_LE(max_rel_error(out, ref, t.rtol, 10 * t.atol), 1.0) << dtype_name(dt) << " " << shape_str(s);
    }
  }
}

}  // namespace
}  // namespace ingot::testing
