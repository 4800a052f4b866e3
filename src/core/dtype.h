// Element types and scalar conversions (bf16, fp16, fp8 e4m3/e5m2 <-> fp32).
// Conversions to narrow types round to nearest even; fp8 saturates to the largest finite value
// (e4m3fn has no infinity, matching PyTorch's float8_e4m3fn).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace moetrain {

// kF64 is an accumulator type only (device-side fp64 sums such as gradient norms); it is not a
// compute float: dtype_is_float() is false for it, so ops reject it where they expect f32/bf16.
enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kF8E5M2, kI32, kI64, kU8, kF64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);              // "f32", "bf16", ...
const char* dtype_safetensors_name(DType t);  // "F32", "BF16", "F8_E4M3", ...
bool dtype_from_safetensors_name(const std::string& s, DType* out);
bool dtype_is_float(DType t);

inline float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);
float f8e4m3_to_float(uint8_t v);
uint8_t float_to_f8e4m3(float f);
float f8e5m2_to_float(uint8_t v);
uint8_t float_to_f8e5m2(float f);

// Read element i of a buffer of type t as double / write it (CPU only; for tests and I/O).
double load_as_double(const void* base, DType t, size_t i);
void store_from_double(void* base, DType t, size_t i, double v);

}  // namespace moetrain
