// NF4 (runtime/kernels/nf4.h): the codebook is QLoRA's NormalFloat construction, the absmax map is
// bitsandbytes' signed dynamic map, codes are the nearest values packed high nibble first, double quantization
// keeps the absmax within 1%, and bad weights are errors naming the tensor.
#include "runtime/kernels/nf4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "runtime/error.h"
#include "runtime/rng.h"
#include "tests/testing.h"

namespace ingot {
namespace {

// Standard normal quantile by bisection on the CDF (double precision; the test's own reference).
double norm_ppf(double p) {
  double lo = -10, hi = 10;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

std::vector<double> linspace(double a, double b, int n) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(a + (b - a) * i / (n - 1));
  return v;
}

// The codes of a quantized tensor, one per element (unpacked from the bytes: high nibble first).
std::vector<int> unpack_codes(const Nf4Tensor& q) {
  const Tensor c = q.codes.to(Device::cpu());
  const auto* bytes = static_cast<const uint8_t*>(c.data_ptr());
  std::vector<int> out;
  for (int64_t i = 0; i < q.numel() / 2; ++i) {
    out.push_back(bytes[i] >> 4);
    out.push_back(bytes[i] & 15);
  }
  return out;
}

int nearest_code(double x) {
  int best = 0;
  for (int c = 1; c < 16; ++c)
    if (std::fabs(x - kNf4Codebook[c]) < std::fabs(x - kNf4Codebook[best])) best = c;
  return best;
}

using ingot::testing::error_of;

TEST(Nf4, CodebookIsTheQloraPapersNormalFloatConstruction) {
  // QLoRA appendix E: quantiles of N(0, 1) at 8 (positive) and 7 (negative) evenly spaced probabilities from
  // offset = (1 - 1/(2*15) + 1 - 1/(2*16)) / 2 to 0.5, an exact zero, normalized to [-1, 1].
  const double offset = 0.9677083;
  std::vector<double> v;
  for (double p : linspace(offset, 0.5, 9)) v.push_back(norm_ppf(p));
  v.pop_back();
  std::vector<double> neg;
  for (double p : linspace(offset, 0.5, 8)) neg.push_back(-norm_ppf(p));
  neg.pop_back();
  v.insert(v.end(), neg.begin(), neg.end());
  v.push_back(0.0);
  std::sort(v.begin(), v.end());
  const double m = v.back();
  ASSERT_EQ(v.size(), 16u);
  for (size_t i = 0; i < 16; ++i) EXPECT_NEAR(kNf4Codebook[i], v[i] / m, 1e-6) << i;
  // The published values, as bitsandbytes ships them.
  const double published[16] = {-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                                -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                                0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                                0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                                0.7229568362236023, 1.0};
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(kNf4Codebook[i], static_cast<float>(published[i])) << i;
  EXPECT_EQ(kNf4Codebook[7], 0.0f);
}

TEST(Nf4, AbsmaxMapIsTheSignedDynamicMap) {
  const std::array<float, 256>& map = nf4_absmax_map();
  EXPECT_TRUE(std::is_sorted(map.begin(), map.end()));
  EXPECT_EQ(std::set<float>(map.begin(), map.end()).size(), 256u);
  EXPECT_EQ(map[255], 1.0f);
  EXPECT_FLOAT_EQ(map[0], -0.99296875f);  // -(1 - 0.9 / 128): the last midpoint of linspace(0.1, 1, 65)
  EXPECT_FLOAT_EQ(map[254], 0.99296875f);
  // Decade 10^(e - 6) holds 2^e values of each sign (fractions 0.1..1 of it); zero once.
  for (int e = 0; e < 7; ++e) {
    const double lo = 0.1 * std::pow(10.0, e - 6), hi = std::pow(10.0, e - 6);
    int pos = 0, neg = 0;
    for (float x : map) {
      pos += x > lo && x < hi;
      neg += -x > lo && -x < hi;
    }
    EXPECT_EQ(pos, 1 << e) << "decade " << e;
    EXPECT_EQ(neg, 1 << e) << "decade " << e;
  }
  EXPECT_FLOAT_EQ(map[128], 5.5e-7f);  // the smallest positive value, 10^-6 * (0.1 + 1) / 2; map[127] is 0
  EXPECT_EQ(map[127], 0.0f);
}

TEST(Nf4, EncodeTakesTheNearestCodeAndTiesTheLowerOne) {
  for (int i = -1000; i <= 1000; ++i) {
    const float x = static_cast<float>(i) / 1000.0f;
    EXPECT_EQ(nf4_encode(x), nearest_code(x)) << x;
  }
  for (int c = 0; c < 15; ++c) {
    const float mid = (kNf4Codebook[c] + kNf4Codebook[c + 1]) / 2.0f;
    EXPECT_EQ(nf4_encode(mid), c) << "midpoint " << c;
    EXPECT_EQ(nf4_encode(std::nextafter(mid, 2.0f)), c + 1) << "above midpoint " << c;
  }
}

TEST(Nf4, PacksTwoCodesPerByteFirstElementInTheHighNibble) {
  // Block 0: absmax 2, so element i encodes w[i] / 2; block 1 all zero (code 7).
  std::vector<double> w(128, 0.0);
  const double vals[6] = {2.0, -2.0, 0.16, -0.56, 1.1, 0.0};
  for (int i = 0; i < 6; ++i) w[static_cast<size_t>(i)] = vals[i];
  Nf4Tensor q = nf4_quantize(from_vector(w, {2, 64}), "w");
  const auto* bytes = static_cast<const uint8_t*>(q.codes.data_ptr());
  EXPECT_EQ(bytes[0], (15 << 4) | 0);
  EXPECT_EQ(bytes[1], (nearest_code(0.08) << 4) | nearest_code(-0.28));
  EXPECT_EQ(bytes[2], (nearest_code(0.55) << 4) | 7);
  for (int i = 32; i < 64; ++i) EXPECT_EQ(bytes[i], 0x77) << i;
  std::vector<double> d = nf4_dequantize(q, DType::f32).to_vector();
  for (int i = 64; i < 128; ++i) EXPECT_EQ(d[static_cast<size_t>(i)], 0.0) << "zero block, element " << i;
  EXPECT_EQ(q.codes.numel(), 128 / 8);
  EXPECT_EQ(q.absmax_codes.numel(), 1);  // 2 blocks, 4 a word
  EXPECT_EQ(q.absmax_scales.numel(), 1);
}

TEST(Nf4, NormalWeightsRoundTripWithinTheCodebookAndDoubleQuantizedAbsmaxError) {
  manual_seed(3);
  const Tensor w = randn({96, 256}, DType::f32, Device::cpu(), 0.0, 0.02);  // 384 blocks: 2 absmax chunks
  const Nf4Tensor q = nf4_quantize(w, "layer.weight");
  const std::vector<double> x = w.to_vector(), d = nf4_dequantize(q, DType::f32).to_vector();
  const std::vector<int> codes = unpack_codes(q);
  double err = 0, ref_err = 0, worst_absmax = 0;
  for (int64_t b = 0; b < q.blocks(); ++b) {
    double absmax = 0;
    int64_t at = 0;
    for (int64_t i = b * 64; i < (b + 1) * 64; ++i)
      if (std::fabs(x[static_cast<size_t>(i)]) > absmax) absmax = std::fabs(x[static_cast<size_t>(at = i)]);
    // The largest element has code +-1, so it dequantizes to the double-quantized absmax itself.
    const double dq_absmax = std::fabs(d[static_cast<size_t>(at)]);
    worst_absmax = std::max(worst_absmax, std::fabs(dq_absmax - absmax) / absmax);
    for (int64_t i = b * 64; i < (b + 1) * 64; ++i) {
      const size_t k = static_cast<size_t>(i);
      const int want = nearest_code(static_cast<float>(x[k]) * (1.0f / static_cast<float>(absmax)));
      ASSERT_EQ(codes[k], want) << "element " << i;
      ASSERT_EQ(d[k], static_cast<double>(static_cast<float>(kNf4Codebook[want] * static_cast<float>(dq_absmax))))
          << "element " << i;
      err += std::fabs(d[k] - x[k]);
      ref_err += std::fabs(kNf4Codebook[want] * absmax - x[k]);
    }
  }
  EXPECT_LT(worst_absmax, 0.01);  // 8-bit absmax: under 1% off
  EXPECT_LT(err, 1.01 * ref_err);  // and the round trip is as good as with exact absmax values
  // NF4 on normal weights: the mean absolute error is a small fraction of the weights' std (0.02).
  EXPECT_LT(err / static_cast<double>(x.size()), 0.1 * 0.02);
}

TEST(Nf4, SixteenBitWeightsQuantizeAndDequantizeToEachFloatDType) {
  manual_seed(4);
  const Tensor w32 = randn({8, 64}, DType::f32);
  const Nf4Tensor a = nf4_quantize(w32.to(DType::bf16), "a"), b = nf4_quantize(w32.to(DType::f16), "b");
  EXPECT_EQ(a.dtype, DType::bf16);
  for (const Nf4Tensor* q : {&a, &b}) {
    const Tensor f = nf4_dequantize(*q, DType::f32);
    for (DType dt : {DType::bf16, DType::f16}) {
      const Tensor h = nf4_dequantize(*q, dt);
      EXPECT_EQ(h.dtype(), dt);
      EXPECT_EQ(h.to_vector(), f.to(dt).to_vector()) << dtype_name(dt);  // rounded once, from the f32 value
    }
  }
}

TEST(Nf4, MemoryIsAbout4Point13BitsPerWeight) {
  const Tensor w = zeros({1024, 1024});
  const Nf4Tensor q = nf4_quantize(w, "w");
  const int64_t n = 1024 * 1024, blocks = n / 64;
  EXPECT_EQ(static_cast<int64_t>(q.nbytes()), n / 2 + blocks + 4 * (blocks / 256) + 4 * 256);
  EXPECT_NEAR(8.0 * static_cast<double>(q.nbytes() - 4 * 256) / static_cast<double>(n), 4.127, 0.001);
}

TEST(Nf4, BadWeightsAreErrorsNamingTheTensor) {
  std::string msg = error_of([] { nf4_quantize(zeros({10, 10}), "model.layers.3.mlp.down_proj.weight"); });
  EXPECT_NE(msg.find("model.layers.3.mlp.down_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("100 elements"), std::string::npos) << msg;
  EXPECT_NE(msg.find("multiple of the block size 64"), std::string::npos) << msg;
  msg = error_of([] { nf4_quantize(zeros({64}, DType::i64), "model.embed_tokens.weight"); });
  EXPECT_NE(msg.find("model.embed_tokens.weight is i64"), std::string::npos) << msg;
  msg = error_of([] { nf4_quantize(zeros({64}, DType::f64), "x.weight"); });
  EXPECT_NE(msg.find("x.weight is f64"), std::string::npos) << msg;
  msg = error_of([] { nf4_dequantize(nf4_quantize(zeros({64}), "y.weight"), DType::i32); });
  EXPECT_NE(msg.find("y.weight"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ingot
