// DType names, promotion, and the bf16/f16 conversions (round to nearest even, subnormals, inf, NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/rng.h"

namespace ingot {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Reference: the representable value nearest to x among candidates lo and lo + 1 ulp (bit patterns of a
// 16-bit format decoded by `decode`), ties to the even pattern. Works for finite x of either sign.
template <typename Decode>
uint16_t nearest_even(double x, uint16_t lo, uint16_t hi, Decode decode) {
  double dl = std::abs(x - decode(lo)), dh = std::abs(x - decode(hi));
  if (dl != dh) return dl < dh ? lo : hi;
  return (lo & 1) ? hi : lo;
}

TEST(DType, NamesParseBackAndItemsizesMatch) {
  for (DType t : kAllDTypes) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    DType st;
    ASSERT_TRUE(try_parse_st_dtype(dtype_st_name(t), &st));
    EXPECT_EQ(st, t);
  }
  EXPECT_EQ(parse_dtype("BFloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("half"), DType::f16);
  EXPECT_EQ(parse_dtype("float"), DType::f32);
  EXPECT_EQ(itemsize(DType::bf16), 2u);
  EXPECT_EQ(itemsize(DType::i64), 8u);
  EXPECT_EQ(itemsize(DType::b8), 1u);
  DType out = DType::f64;
  EXPECT_FALSE(try_parse_st_dtype("U8", &out));
  EXPECT_FALSE(try_parse_st_dtype("f32", &out));  // safetensors names are upper case only
  EXPECT_EQ(out, DType::f64);
  try {
    parse_dtype("float8");
    ADD_FAILURE() << "parse_dtype accepted float8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'float8'"), std::string::npos) << e.what();
  }
}

TEST(DType, PromotionPrefersFloatsThenWidth) {
  EXPECT_EQ(promote(DType::f32, DType::f32), DType::f32);
  EXPECT_EQ(promote(DType::bf16, DType::f16), DType::f32);
  EXPECT_EQ(promote(DType::bf16, DType::f32), DType::f32);
  EXPECT_EQ(promote(DType::f32, DType::f64), DType::f64);
  EXPECT_EQ(promote(DType::i64, DType::bf16), DType::bf16);
  EXPECT_EQ(promote(DType::b8, DType::i32), DType::i32);
  EXPECT_EQ(promote(DType::i32, DType::i64), DType::i64);
  for (DType a : kAllDTypes)
    for (DType b : kAllDTypes) EXPECT_EQ(promote(a, b), promote(b, a));
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  const float ulp = std::ldexp(1.0f, -7);  // bf16 spacing in [1, 2)
  EXPECT_EQ(float_to_bf16(1.0f + ulp / 2), 0x3f80);               // tie, 1.0 is even
  EXPECT_EQ(float_to_bf16(1.0f + ulp + ulp / 2), 0x3f82);         // tie, rounds up to even
  EXPECT_EQ(float_to_bf16(std::nextafter(1.0f + ulp / 2, 2.0f)), 0x3f81);  // just above the tie
  EXPECT_EQ(float_to_bf16(-(1.0f + ulp / 2)), 0xbf80);
}

TEST(DType, Bf16KeepsInfNanAndSubnormals) {
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // beyond bf16 max + half ulp
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  // NaNs stay NaN even when the payload lives only in the low bits that are dropped.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    uint16_t h = float_to_bf16(from_bits(nan));
    EXPECT_TRUE(std::isnan(bf16_to_float(h))) << std::hex << nan;
    EXPECT_EQ(h >> 15, nan >> 31) << "sign of " << std::hex << nan;
  }
  EXPECT_EQ(float_to_bf16(from_bits(0x00010000u)), 0x0001);  // smallest bf16 subnormal, exact
  EXPECT_EQ(float_to_bf16(from_bits(0x00008000u)), 0x0000);  // half of it: tie to even (0)
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000u)), 0x0002);  // 1.5 of it: tie to even (2)
  EXPECT_EQ(float_to_bf16(from_bits(0x007fffffu)), 0x0080);  // largest f32 subnormal rounds to min normal
}

TEST(DType, Bf16MatchesAReferenceOnRandomFloats) {
  // For rounding, infinity sits where the next power of two would be (IEEE overflow rule).
  auto decode = [](uint16_t h) {
    if ((h & 0x7fff) == 0x7f80) return std::copysign(std::ldexp(1.0, 128), bf16_to_float(h));
    return static_cast<double>(bf16_to_float(h));
  };
  for (uint64_t i = 0; i < 200000; ++i) {
    uint32_t u = philox4x32_10(7, i).v[0];
    float f = from_bits(u);
    if (!std::isfinite(f)) continue;
    uint16_t lo = static_cast<uint16_t>(u >> 16);
    uint16_t hi = static_cast<uint16_t>(lo + 1);  // the next magnitude, possibly inf
    ASSERT_EQ(float_to_bf16(f), nearest_even(f, lo, hi, decode)) << std::hex << "bits 0x" << u;
  }
}

TEST(DType, EveryBf16AndF16PatternRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t b = static_cast<uint16_t>(h);
    float fb = bf16_to_float(b), fh = f16_to_float(b);
    if (std::isnan(fb)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(fb)))) << std::hex << h;
    } else {
      ASSERT_EQ(float_to_bf16(fb), b) << std::hex << h;
    }
    if (std::isnan(fh)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(fh)))) << std::hex << h;
    } else {
      ASSERT_EQ(float_to_f16(fh), b) << std::hex << h << " -> " << fh;
    }
  }
}

TEST(DType, F16DecodesKnownValues) {
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0400), std::ldexp(1.0f, -14));   // min normal
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));   // min subnormal
  EXPECT_EQ(f16_to_float(0x03ff), std::ldexp(1023.0f, -24));  // max subnormal
  EXPECT_EQ(f16_to_float(0x7c00), INFINITY);
  EXPECT_EQ(f16_to_float(0xfc00), -INFINITY);
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
  EXPECT_TRUE(std::signbit(f16_to_float(0x8000)));
}

TEST(DType, F16RoundsToNearestEvenIncludingSubnormalsAndOverflow) {
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);  // below the tie with 65536
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // tie, 0x7bff is odd: overflows to inf
  EXPECT_EQ(float_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(float_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);                         // tie to even
  EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);                     // tie to even
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);                                // half min subnormal
  EXPECT_EQ(float_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(float_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);                            // 1.5: tie to 2
  EXPECT_EQ(float_to_f16(std::ldexp(1023.5f, -24)), 0x0400);  // max subnormal + half: carries to min normal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(float_to_f16(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_f16(INFINITY), 0x7c00);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(NAN))));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(from_bits(0x7f800001u)))));  // low-bit payload
}

TEST(DType, F16MatchesAReferenceOnRandomFloats) {
  // For rounding, infinity sits where the next power of two would be (IEEE overflow rule).
  auto decode = [](uint16_t h) { return h == 0x7c00 ? 65536.0 : static_cast<double>(f16_to_float(h)); };
  for (uint64_t i = 0; i < 200000; ++i) {
    Philox4 r = philox4x32_10(8, i);
    // Magnitudes spread over the f16 range and a bit beyond, both signs.
    float f = std::ldexp(static_cast<float>(r.v[0] >> 8) / 16777216.0f, static_cast<int>(r.v[1] % 46) - 28);
    if (r.v[2] & 1) f = -f;
    // Bracket |f| by the f16 pattern that truncation gives and the next one.
    double a = std::abs(static_cast<double>(f));
    uint16_t lo = 0;
    for (int bit = 14; bit >= 0; --bit) {
      uint16_t cand = static_cast<uint16_t>(lo | (1u << bit));
      if (cand < 0x7c00 && decode(cand) <= a) lo = cand;
    }
    uint16_t want = nearest_even(a, lo, static_cast<uint16_t>(lo + 1), decode);
    if (f < 0) want |= 0x8000;
    ASSERT_EQ(float_to_f16(f), want) << "f = " << f;
  }
}

#if defined(__FLT16_MAX__)
// The compiler's _Float16 conversion is correctly rounded: a second, independent reference.
TEST(DType, F16MatchesTheCompilersFloat16Conversion) {
  for (uint64_t i = 0; i < 200000; ++i) {
    float f = from_bits(philox4x32_10(9, i).v[3]);
    _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
      continue;
    }
    ASSERT_EQ(float_to_f16(f), want) << std::hex << "bits 0x" << bits_of(f);
  }
}
#endif

}  // namespace
}  // namespace ingot
