#include "runtime/dtype.h"

#include <algorithm>
#include <cctype>

#include "runtime/error.h"

namespace ingot {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::b8: return "bool";
  }
  return "?";
}

std::string_view dtype_st_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::b8: return "BOOL";
  }
  return "?";
}

bool try_parse_st_dtype(std::string_view s, DType* out) {
  for (DType t : kAllDTypes) {
    if (dtype_st_name(t) == s) {
      *out = t;
      return true;
    }
  }
  return false;
}

DType parse_dtype(std::string_view s) {
  std::string l(s);
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "f32" || l == "float32" || l == "fp32" || l == "float") return DType::f32;
  if (l == "f64" || l == "float64" || l == "fp64" || l == "double") return DType::f64;
  if (l == "bf16" || l == "bfloat16") return DType::bf16;
  if (l == "f16" || l == "float16" || l == "fp16" || l == "half") return DType::f16;
  if (l == "i32" || l == "int32") return DType::i32;
  if (l == "i64" || l == "int64" || l == "long") return DType::i64;
  if (l == "bool" || l == "b8") return DType::b8;
  INGOT_FAIL("unknown dtype '", s, "' (expected one of f32, f64, bf16, f16, i32, i64, bool)");
}

DType promote(DType a, DType b) {
  if (a == b) return a;
  if (is_floating(a) != is_floating(b)) return is_floating(a) ? a : b;
  if (is_floating(a)) {
    if (a == DType::f64 || b == DType::f64) return DType::f64;
    return DType::f32;  // mixes of f32/bf16/f16
  }
  if (a == DType::i64 || b == DType::i64) return DType::i64;
  if (a == DType::i32 || b == DType::i32) return DType::i32;
  return DType::b8;
}

}  // namespace ingot
