// Rows encoded as ggml blocks for tests: Q8_0, Q4_K, Q5_K and Q6_K in ggml's block layout (the
// one gguf-py's quants.py decodes), from a plain range fit per sub-block, not llama.cpp's search.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/dtype.h"
#include "core/gguf_quants.h"

namespace petrel::test {

// Appends `v` as f16 and returns the value the f16 holds.
inline float put_f16(std::vector<uint8_t>& out, float v) {
  const _Float16 h = static_cast<_Float16>(v);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  out.push_back(uint8_t(bits));
  out.push_back(uint8_t(bits >> 8));
  return f16_to_f32(bits);
}

// Q8_0: 32 elements, an f16 scale amax/127 then int8 codes.
inline void q8_0_block(const float* x, std::vector<uint8_t>& out) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = put_f16(out, amax / 127);
  for (int i = 0; i < 32; ++i)
    out.push_back(uint8_t(int8_t(d > 0 ? std::clamp(std::lround(x[i] / d), -127L, 127L) : 0)));
}

// Q4_K (bits 4) and Q5_K (bits 5): 256 elements as 8 sub-blocks of 32, x ≈ d·sc·q − dmin·m with
// 6-bit sc and m per sub-block; block = d, dmin, 12 packed scale bytes, [Q5_K: 32 bytes of 5th
// bits, bit s for sub-block s], then 128 bytes of low nibbles (byte 32g+l: sub-blocks 2g, 2g+1).
inline void q45_k_block(const float* x, int bits, std::vector<uint8_t>& out) {
  const int nmax = (1 << bits) - 1;
  float step[8], offset[8], max_step = 0, max_offset = 0;
  for (int s = 0; s < 8; ++s) {
    const auto [lo, hi] = std::minmax_element(x + 32 * s, x + 32 * s + 32);
    offset[s] = -std::min(0.0f, *lo);  // the codes start at min(0, lo): the offset is never negative
    step[s] = (*hi + offset[s]) / nmax;
    max_step = std::max(max_step, step[s]);
    max_offset = std::max(max_offset, offset[s]);
  }
  const float d = put_f16(out, max_step / 63), dmin = put_f16(out, max_offset / 63);
  uint8_t sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = uint8_t(d > 0 ? std::min(63.0f, std::ceil(step[s] / d)) : 0);  // rounded up: the top code is never clipped
    m[s] = uint8_t(dmin > 0 ? std::min(63L, std::lround(offset[s] / dmin)) : 0);
  }
  // Bytes 0-3 and 4-7: sc and m of sub-blocks 0-3, with the top 2 bits of those of 4-7 in bits 6-7;
  // bytes 8-11: the low nibbles of sc (low) and m (high) of sub-blocks 4-7.
  for (int i = 0; i < 4; ++i) out.push_back(uint8_t(sc[i] | (sc[i + 4] >> 4) << 6));
  for (int i = 0; i < 4; ++i) out.push_back(uint8_t(m[i] | (m[i + 4] >> 4) << 6));
  for (int i = 0; i < 4; ++i) out.push_back(uint8_t((sc[i + 4] & 0xF) | (m[i + 4] & 0xF) << 4));
  uint8_t q[256];
  for (int e = 0; e < 256; ++e) {
    const float D = d * sc[e / 32], M = dmin * m[e / 32];
    q[e] = uint8_t(D > 0 ? std::clamp(std::lround((x[e] + M) / D), 0L, long(nmax)) : 0);
  }
  if (bits == 5) {
    uint8_t qh[32] = {};
    for (int e = 0; e < 256; ++e) qh[e % 32] |= uint8_t((q[e] >> 4) << (e / 32));
    out.insert(out.end(), qh, qh + 32);
  }
  for (int g = 0; g < 4; ++g)
    for (int l = 0; l < 32; ++l) out.push_back(uint8_t((q[64 * g + l] & 0xF) | (q[64 * g + 32 + l] & 0xF) << 4));
}

// Q6_K: 256 elements as 16 sub-blocks of 16, x ≈ d·sc·(q − 32) with int8 sc; block = 128 bytes of
// low nibbles, 64 bytes of top 2 bits, 16 scales, then d. Per half of 128 elements, element w's
// nibble is in byte w % 64 (shift 4·(w / 64)) and its top bits in byte w % 32 (shift 2·(w / 32)).
inline void q6_k_block(const float* x, std::vector<uint8_t>& out) {
  float step[16], max_step = 0;
  for (int s = 0; s < 16; ++s) {
    float amax = 0;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[16 * s + i]));
    step[s] = amax / 31;
    max_step = std::max(max_step, step[s]);
  }
  std::vector<uint8_t> d_bytes;
  const float d = put_f16(d_bytes, max_step / 127);
  int8_t sc[16];
  for (int s = 0; s < 16; ++s) sc[s] = int8_t(d > 0 ? std::min(127.0f, std::ceil(step[s] / d)) : 0);
  uint8_t ql[128] = {}, qh[64] = {};
  for (int e = 0; e < 256; ++e) {
    const float D = d * sc[e / 16];
    const int q = int(D > 0 ? std::clamp(std::lround(x[e] / D), -32L, 31L) : 0) + 32;
    const int half = e / 128, w = e % 128;
    ql[64 * half + w % 64] |= uint8_t((q & 0xF) << 4 * (w / 64));
    qh[32 * half + w % 32] |= uint8_t((q >> 4) << 2 * (w / 32));
  }
  out.insert(out.end(), ql, ql + 128);
  out.insert(out.end(), qh, qh + 64);
  for (int8_t s : sc) out.push_back(uint8_t(s));
  out.insert(out.end(), d_bytes.begin(), d_bytes.end());
}

// `n` floats (whole blocks of `type`) as ggml blocks of Q8_0, Q4_K, Q5_K or Q6_K.
inline std::vector<uint8_t> ggml_encode(GgmlType type, const float* x, int64_t n) {
  std::vector<uint8_t> out;
  const int64_t block = ggml_type_info(type).block;
  if (n % block != 0) throw std::invalid_argument("ggml_encode: not whole blocks");
  out.reserve(size_t(ggml_row_bytes(type, n)));
  for (int64_t b = 0; b < n; b += block) {
    switch (type) {
      case GgmlType::Q8_0: q8_0_block(x + b, out); break;
      case GgmlType::Q4_K: q45_k_block(x + b, 4, out); break;
      case GgmlType::Q5_K: q45_k_block(x + b, 5, out); break;
      case GgmlType::Q6_K: q6_k_block(x + b, out); break;
      default: throw std::invalid_argument("ggml_encode: unsupported type");
    }
  }
  return out;
}

}  // namespace petrel::test
