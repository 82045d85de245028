// Element types. bf16 and f16 are stored as raw 16-bit patterns; arithmetic on them happens in float
// (CPU kernels) or in the CUDA native types (GPU kernels). f64 exists for gradient checks and references.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#if defined(__CUDACC__)
#define INGOT_HD __host__ __device__ __forceinline__
#else
#define INGOT_HD inline
#endif

namespace ingot {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, b8 };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16,
                                       DType::i32, DType::i64, DType::b8};

constexpr size_t itemsize(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: return 2;
    case DType::b8: return 1;
  }
  return 0;
}
constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}
constexpr bool is_integral(DType t) { return t == DType::i32 || t == DType::i64 || t == DType::b8; }

// Short names used in printing and configs: "f32", "bf16", ...
std::string_view dtype_name(DType t);
// safetensors / Hugging Face names: "F32", "BF16", "F16", "F64", "I32", "I64", "BOOL".
std::string_view dtype_st_name(DType t);
// Parses either spelling (also "float32", "bfloat16", "float16", "fp32", "bf16"...); throws on unknown.
DType parse_dtype(std::string_view s);
bool try_parse_st_dtype(std::string_view s, DType* out);

// The type two operands are computed in (float beats int, wider float beats narrower; bf16+f16 -> f32).
DType promote(DType a, DType b);

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

INGOT_HD float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, NaN stays NaN.
INGOT_HD uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
INGOT_HD float f16_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) { mant <<= 1; --exp; }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}
INGOT_HD uint16_t float_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((u >> 23) & 0xffu) - 127 + 15;
  uint32_t mant = u & 0x7fffffu;
  if (((u >> 23) & 0xffu) == 0xffu) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  return static_cast<uint16_t>(h);
}

}  // namespace ingot
