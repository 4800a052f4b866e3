// Scalar dtype conversions. fp16/fp8 go through a generic IEEE-style encoder parameterized by
// exponent and mantissa widths; e4m3fn is special-cased (no inf, 0x7f/0xff are NaN, max 448).
#include "core/dtype.h"

#include <cmath>

#include "core/check.h"

namespace moetrain {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: return 2;
    case DType::kF8E4M3: case DType::kF8E5M2: case DType::kU8: return 1;
    case DType::kI64: case DType::kF64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF8E4M3: return "f8e4m3";
    case DType::kF8E5M2: return "f8e5m2";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kF64: return "f64";
  }
  return "?";
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E5M2: return "F8_E5M2";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kF64: return "F64";
  }
  return "?";
}

bool dtype_from_safetensors_name(const std::string& s, DType* out) {
  static const struct { const char* n; DType t; } table[] = {
      {"F32", DType::kF32}, {"BF16", DType::kBF16}, {"F16", DType::kF16},
      {"F8_E4M3", DType::kF8E4M3}, {"F8_E5M2", DType::kF8E5M2}, {"I32", DType::kI32},
      {"I64", DType::kI64}, {"U8", DType::kU8}};
  for (auto& e : table)
    if (s == e.n) { *out = e.t; return true; }
  return false;
}

bool dtype_is_float(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF8E4M3 ||
         t == DType::kF8E5M2;
}

namespace {
// Decode a small float with `eb` exponent bits and `mb` mantissa bits (sign bit on top).
float decode_small(uint32_t v, int eb, int mb, bool has_inf) {
  uint32_t sign = (v >> (eb + mb)) & 1u;
  uint32_t exp = (v >> mb) & ((1u << eb) - 1);
  uint32_t man = v & ((1u << mb) - 1);
  int bias = (1 << (eb - 1)) - 1;
  float r;
  if (exp == 0) {
    r = std::ldexp(static_cast<float>(man), 1 - bias - mb);
  } else if (has_inf && exp == (1u << eb) - 1) {
    r = man ? NAN : INFINITY;
  } else {
    r = std::ldexp(static_cast<float>(man | (1u << mb)), static_cast<int>(exp) - bias - mb);
  }
  return sign ? -r : r;
}

// Encode with round-to-nearest-even; max_code is the largest finite magnitude code.
uint32_t encode_small(float f, int eb, int mb, uint32_t max_code, uint32_t nan_code, bool saturate) {
  uint32_t sign = std::signbit(f) ? 1u : 0u;
  uint32_t sbit = sign << (eb + mb);
  if (std::isnan(f)) return sbit | nan_code;
  float a = std::fabs(f);
  float maxv = decode_small(max_code, eb, mb, false);
  if (a >= maxv) {
    if (saturate || !std::isinf(a)) {
      // beyond max: saturate for fp8; for fp16 values above max round to inf if past halfway
      if (!saturate) {
        float next = std::ldexp(1.0f, (1 << (eb - 1)));  // 2^(bias+1): the would-be next binade
        if (a >= (maxv + next) / 2) return sbit | (((1u << eb) - 1) << mb);
      }
      return sbit | max_code;
    }
    return sbit | (((1u << eb) - 1) << mb);  // inf
  }
  if (a == 0.0f) return sbit;
  int bias = (1 << (eb - 1)) - 1;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1 + bias;
  if (exp <= 0) {  // subnormal: quantum 2^(1-bias-mb)
    float q = std::ldexp(a, -(1 - bias - mb));
    uint32_t m = static_cast<uint32_t>(std::nearbyint(q));  // default rounding mode is RNE
    return sbit | m;  // m == 1<<mb naturally becomes the smallest normal
  }
  float q = std::ldexp(a, -(exp - bias - mb));  // in [2^mb, 2^(mb+1))
  uint32_t m = static_cast<uint32_t>(std::nearbyint(q));
  uint32_t code = (static_cast<uint32_t>(exp) << mb) + (m - (1u << mb));  // carry rolls exponent
  if (code > max_code) code = max_code;
  return sbit | code;
}
}  // namespace

float f16_to_float(uint16_t h) { return decode_small(h, 5, 10, true); }
uint16_t float_to_f16(float f) { return static_cast<uint16_t>(encode_small(f, 5, 10, 0x7bff, 0x7e00, false)); }
float f8e4m3_to_float(uint8_t v) {
  if ((v & 0x7f) == 0x7f) return NAN;
  return decode_small(v, 4, 3, false);
}
uint8_t float_to_f8e4m3(float f) { return static_cast<uint8_t>(encode_small(f, 4, 3, 0x7e, 0x7f, true)); }
float f8e5m2_to_float(uint8_t v) { return decode_small(v, 5, 2, true); }
uint8_t float_to_f8e5m2(float f) { return static_cast<uint8_t>(encode_small(f, 5, 2, 0x7b, 0x7e, true)); }

double load_as_double(const void* base, DType t, size_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16: return f16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kF8E4M3: return f8e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::kF8E5M2: return f8e5m2_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::kI32: return static_cast<const int32_t*>(base)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::kU8: return static_cast<const uint8_t*>(base)[i];
    case DType::kF64: return static_cast<const double*>(base)[i];
  }
  return 0;
}

void store_from_double(void* base, DType t, size_t i, double v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::kF16: static_cast<uint16_t*>(base)[i] = float_to_f16(static_cast<float>(v)); break;
    case DType::kF8E4M3: static_cast<uint8_t*>(base)[i] = float_to_f8e4m3(static_cast<float>(v)); break;
    case DType::kF8E5M2: static_cast<uint8_t*>(base)[i] = float_to_f8e5m2(static_cast<float>(v)); break;
    case DType::kI32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::kI64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case DType::kU8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
    case DType::kF64: static_cast<double*>(base)[i] = v; break;
  }
}

}  // namespace moetrain
