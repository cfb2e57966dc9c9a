// FP8 E4M3 ("e4m3fn", the OCP format of fine-grained FP8 checkpoints): 1 sign bit, 4 exponent bits
// (bias 7), 3 mantissa bits, no infinities; S.1111.111 is NaN, so the largest finite value is 448.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

namespace petrel {

// The exact value of an e4m3 code: every one is a small binary fraction that fp32 holds exactly.
constexpr float e4m3_value(uint8_t code) {
  const int exp = (code >> 3) & 0xf, mant = code & 0x7;
  float v = 0.0f;
  if (exp == 0xf && mant == 0x7) {
    v = __builtin_nanf("");
  } else {
    // Subnormals (exp 0) are mant·2^-9; normals (1 + mant/8)·2^(exp-7) = (8 + mant)·2^(exp-10).
    const int m = exp == 0 ? mant : 8 + mant;
    const int e = exp == 0 ? -9 : exp - 10;
    v = float(m);
    for (int i = 0; i < e; ++i) v *= 2.0f;
    for (int i = e; i < 0; ++i) v *= 0.5f;
  }
  return (code & 0x80) ? -v : v;
}

// Every code's value, built at compile time: a row decode is one lookup per weight.
inline constexpr std::array<float, 256> kE4m3Values = [] {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[size_t(c)] = e4m3_value(uint8_t(c));
  return t;
}();

inline bool e4m3_is_nan(uint8_t code) { return (code & 0x7f) == 0x7f; }

// The fp32 bits of the value of the e4m3 code in w's top byte, times 2^-120, in two integer
// operations (the GPU kernels' decode, no conversion instruction): the arithmetic shift moves the
// code's 7 exponent and mantissa bits to bits 20-26, where its exponent field lands 120 below its
// fp32 place (bias 7 against 127), and copies its sign bit upwards; the mask keeps bit 31 and those
// 7. Subnormal codes become fp32 denormals of the same value. Not for NaN codes.
constexpr uint32_t e4m3_top_bits(uint32_t w) { return uint32_t((int32_t(w) >> 4) & int32_t(0x87F00000u)); }
constexpr float kE4m3TopUnscale = 0x1p120f;  // e4m3_top_bits' value times this is the code's

// Index of the first NaN code among n bytes, or n when there is none.
size_t find_e4m3_nan(const uint8_t* codes, size_t n);

// The code nearest to x, ties to the even code (as torch's cast to float8_e4m3fn rounds); values
// beyond +-448 give +-448 (callers clamp first, as FP8 quantizers do); NaN gives 0x7f.
uint8_t e4m3_from_f32(float x);

}  // namespace petrel
