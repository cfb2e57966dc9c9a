// Element types found in checkpoints and the scalar conversions between them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace petrel {

// F8_E4M3: fp8 weight codes (core/fp8.h), only ever read with their block scales.
enum class DType { F32, F16, BF16, U32, I8, U8, I32, I64, F8_E4M3 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses a safetensors dtype string ("BF16", "F32", ...); returns false when unknown.
bool parse_safetensors_dtype(const std::string& s, DType* out);

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even, as PyTorch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float f16_to_f32(uint16_t h);

// Reads element i of a float-typed buffer (F32, F16 or BF16) as fp32.
inline float load_as_f32(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(data)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default: return 0.0f;
  }
}

inline bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Converts n elements of a float-typed buffer to fp32.
void convert_to_f32(const void* src, DType t, size_t n, float* dst);

}  // namespace petrel
