#include "core/gguf_quants.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace petrel {
namespace {

constexpr int64_t kQK_K = 256;  // elements of a K-quant super-block

// ggml's type traits (ggml.c `type_traits`; gguf-py constants.py GGML_QUANT_SIZES).
constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::F32, "F32", 1, 4, true},
    {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::Q4_0, "Q4_0", 32, 2 + 16, true},
    {GgmlType::Q4_1, "Q4_1", 32, 2 + 2 + 16, true},
    {GgmlType::Q5_0, "Q5_0", 32, 2 + 4 + 16, true},
    {GgmlType::Q5_1, "Q5_1", 32, 2 + 2 + 4 + 16, true},
    {GgmlType::Q8_0, "Q8_0", 32, 2 + 32, true},
    {GgmlType::Q8_1, "Q8_1", 32, 4 + 4 + 32, false},
    {GgmlType::Q2_K, "Q2_K", kQK_K, 2 + 2 + kQK_K / 16 + kQK_K / 4, true},
    {GgmlType::Q3_K, "Q3_K", kQK_K, 2 + kQK_K / 4 + kQK_K / 8 + 12, true},
    {GgmlType::Q4_K, "Q4_K", kQK_K, 2 + 2 + kQK_K / 2 + 12, true},
    {GgmlType::Q5_K, "Q5_K", kQK_K, 2 + 2 + kQK_K / 2 + kQK_K / 8 + 12, true},
    {GgmlType::Q6_K, "Q6_K", kQK_K, 2 + kQK_K / 2 + kQK_K / 4 + kQK_K / 16, true},
    {GgmlType::Q8_K, "Q8_K", kQK_K, 4 + kQK_K + kQK_K / 8, false},
    {GgmlType::IQ2_XXS, "IQ2_XXS", kQK_K, 2 + kQK_K / 4, false},
    {GgmlType::IQ2_XS, "IQ2_XS", kQK_K, 2 + kQK_K / 4 + kQK_K / 32, false},
    {GgmlType::IQ3_XXS, "IQ3_XXS", kQK_K, 2 + kQK_K / 4 + kQK_K / 8, false},
    {GgmlType::IQ1_S, "IQ1_S", kQK_K, 2 + kQK_K / 8 + kQK_K / 16, false},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 2 + 16, true},
    {GgmlType::IQ3_S, "IQ3_S", kQK_K, 2 + kQK_K / 4 + kQK_K / 8 + kQK_K / 32 + 4, false},
    {GgmlType::IQ2_S, "IQ2_S", kQK_K, 2 + kQK_K / 4 + kQK_K / 16, false},
    {GgmlType::IQ4_XS, "IQ4_XS", kQK_K, 2 + 2 + kQK_K / 2 + kQK_K / 64, true},
    {GgmlType::I8, "I8", 1, 1, false},
    {GgmlType::I16, "I16", 1, 2, false},
    {GgmlType::I32, "I32", 1, 4, false},
    {GgmlType::I64, "I64", 1, 8, false},
    {GgmlType::F64, "F64", 1, 8, false},
    {GgmlType::IQ1_M, "IQ1_M", kQK_K, kQK_K / 8 + kQK_K / 16 + kQK_K / 32, false},
    {GgmlType::BF16, "BF16", 1, 2, true},
    {GgmlType::TQ1_0, "TQ1_0", kQK_K, 2 + 4 * 13, false},
    {GgmlType::TQ2_0, "TQ2_0", kQK_K, 2 + 64, false},
    {GgmlType::MXFP4, "MXFP4", 32, 1 + 16, false},
    {GgmlType::NVFP4, "NVFP4", 64, 4 + 32, false},
    {GgmlType::Q1_0, "Q1_0", 128, 2 + 16, false},
    {GgmlType::Q2_0, "Q2_0", 64, 2 + 16, false},
};

// Each decoder below follows its gguf-py class (gguf-py/gguf/quants.py, `dequantize_blocks`): the
// same element order and the same fp32 operations in the same order, one rounding each. This file
// is compiled with -ffp-contract=off (src/CMakeLists.txt): a fused multiply-add would round once
// where numpy rounds twice.

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// 4-bit codes of a 32-element block: element j < 16 is the low nibble of qs[j], j >= 16 the high
// nibble of qs[j - 16].
inline uint8_t nibble32(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4; }

// The fifth bit of element j in a Q5_0 / Q5_1 block: bit j of the little-endian u32 qh.
inline uint8_t qh_bit(const uint8_t* qh, int j) { return (qh[j / 8] >> (j % 8)) & 1; }

// Q4_0: d (f16), 16 bytes of nibbles; x = d·(q - 8).
void q4_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < 32; ++j) y[j] = d * float(int(nibble32(b + 2, j)) - 8);
}

// Q4_1: d, m (f16), nibbles; x = d·q + m.
void q4_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * float(nibble32(b + 4, j)) + m;
}

// Q5_0: d, qh (u32 of fifth bits), nibbles; x = d·(q - 16).
void q5_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < 32; ++j) y[j] = d * float(int(nibble32(b + 6, j) | qh_bit(b + 2, j) << 4) - 16);
}

// Q5_1: d, m, qh, nibbles; x = d·q + m.
void q5_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * float(nibble32(b + 8, j) | qh_bit(b + 4, j) << 4) + m;
}

// Q8_0: d, 32 int8 codes; x = q·d.
void q8_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
}

// Q2_K: scales[16] (low nibble: scale, high: min of each 16 elements), qs[64], d, dmin.
// Element e = 128·h + 32·s + l holds bits 2s..2s+1 of qs[32·h + l]; x = (d·sc)·q - (dmin·m).
inline int q2_k_code(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3; }

void q2_k(const uint8_t* b, float* y) {
  const uint8_t* sc = b;
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (int e = 0; e < 256; ++e) {
    const float dl = d * float(sc[e / 16] & 0x0f), ml = dmin * float(sc[e / 16] >> 4);
    y[e] = dl * float(q2_k_code(b + 16, e)) - ml;
  }
}

// Q3_K: hmask[32], qs[64], scales[12] (sixteen 6-bit scales), d. Element e = 128·h + 32·s + l:
// low bits 2s..2s+1 of qs[32·h + l], high bit e/32 of hmask[l] (set: +0, clear: -4);
// x = (d·(scale - 32))·q.
void q3_k_scales(const uint8_t* b, float* dl) {
  const uint8_t* sc = b + 96;
  const float d = f16_at(b + 108);
  for (int k = 0; k < 16; ++k) {
    const int low = (sc[k % 8] >> (4 * (k / 8))) & 0x0f;
    const int high = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
    dl[k] = d * float(int8_t(uint8_t(low | high << 4)) - 32);
  }
}
// Element e's code plus 4 (0..7): the low bits, and 4 where the hmask bit is set.
inline int q3_k_code4(const uint8_t* b, int e) {
  const int ql = (b[32 + 32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
  return ql | ((b[e % 32] >> (e / 32)) & 1) << 2;
}

void q3_k(const uint8_t* b, float* y) {
  float dl[16];
  q3_k_scales(b, dl);
  for (int e = 0; e < 256; ++e) y[e] = dl[e / 16] * float(q3_k_code4(b, e) - 4);
}

// The eight 6-bit scales and mins of Q4_K / Q5_K, packed in 12 bytes (gguf-py Q4_K.get_scale_min).
void k_scale_min(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 0x3f;
    mn[j] = s[4 + j] & 0x3f;
    sc[4 + j] = (s[8 + j] & 0x0f) | ((s[j] >> 2) & 0x30);
    mn[4 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30);
  }
}

// Q4_K: d, dmin, scales[12], qs[128]. Group g = 2c + a of 32 elements holds nibble a of
// qs[32c .. 32c+31]; x = (d·sc_g)·q - (dmin·m_g). Q5_K: d, dmin, scales[12], qh[32], qs[128]: the
// same nibbles plus bit g of qh[l] as the fifth bit.
inline int k_nibble(const uint8_t* qs, int g, int l) { return (qs[32 * (g / 2) + l] >> (4 * (g % 2))) & 0x0f; }
inline int q5_k_code(const uint8_t* b, int g, int l) { return k_nibble(b + 48, g, l) | (((b[16 + l] >> g) & 1) << 4); }

void q4_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  uint8_t sc[8], mn[8];
  k_scale_min(b + 4, sc, mn);
  for (int g = 0; g < 8; ++g) {
    const float dg = d * float(sc[g]), mg = dmin * float(mn[g]);
    for (int l = 0; l < 32; ++l) y[32 * g + l] = dg * float(k_nibble(b + 16, g, l)) - mg;
  }
}

void q5_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  uint8_t sc[8], mn[8];
  k_scale_min(b + 4, sc, mn);
  for (int g = 0; g < 8; ++g) {
    const float dg = d * float(sc[g]), mg = dmin * float(mn[g]);
    for (int l = 0; l < 32; ++l) y[32 * g + l] = dg * float(q5_k_code(b, g, l)) - mg;
  }
}

// Q6_K: ql[128], qh[64], scales[16] (int8), d. Element e = 128·h + 64·a + l (l < 64) takes nibble
// a of ql[64·h + l]; its top two bits are bits 2s..2s+1 of qh[32·h + e%32] with s = (e%128)/32;
// x = (d·scale)·(q - 32).
inline int q6_k_code(const uint8_t* b, int e) {
  const int h = e / 128, r = e % 128;
  const int low = (b[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
  const int high = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
  return low | high << 4;
}

void q6_k(const uint8_t* b, float* y) {
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (int e = 0; e < 256; ++e) y[e] = (d * float(sc[e / 16])) * float(q6_k_code(b, e) - 32);
}

// IQ4_NL's codes and scale: d, nibbles laid out as Q4_0's; x = d·level[q].
float iq4_nl_codes(const uint8_t* b, uint8_t* q) {
  for (int j = 0; j < 32; ++j) q[j] = nibble32(b + 2, j);
  return f16_at(b);
}

void iq4_nl(const uint8_t* b, float* y) {
  uint8_t q[32];
  const float d = iq4_nl_codes(b, q);
  for (int j = 0; j < 32; ++j) y[j] = d * float(kIq4Levels[q[j]]);
}

// IQ4_XS's codes and the scale of each group of 32: d, scales_h (u16: 2 bits per group),
// scales_l[4] (a nibble per group), qs[128]. Group j takes nibble a of qs[16j .. 16j+15] at element
// 16a + l; x = (d·(scale - 32))·level[q].
void iq4_xs_codes(const uint8_t* b, uint8_t* q, float* group_scales) {
  const float d = f16_at(b);
  const uint16_t sh = uint16_t(b[2] | b[3] << 8);
  const uint8_t* sl = b + 4;
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 8; ++j) {
    const int scale = ((sl[j / 2] >> (4 * (j % 2))) & 0x0f) | (((sh >> (2 * j)) & 3) << 4);
    group_scales[j] = d * float(int8_t(uint8_t(scale)) - 32);
    for (int k = 0; k < 32; ++k) q[32 * j + k] = (qs[16 * j + k % 16] >> (4 * (k / 16))) & 0x0f;
  }
}

void iq4_xs(const uint8_t* b, float* y) {
  uint8_t q[256];
  float dl[8];
  iq4_xs_codes(b, q, dl);
  for (int e = 0; e < 256; ++e) y[e] = dl[e / 32] * float(kIq4Levels[q[e]]);
}

// The affine forms: each fills a block's codes q (one per element) and each group's scale s and
// bias o, with x = s·q + o. Where the decoder above writes x = d·(q - c), o = -c·d: both products
// are exact in fp32 (at most 24 significant bits), so the value is the decoder's to the bit.
using AffineBlock = void (*)(const uint8_t* b, uint8_t* q, float* s, float* o);

void q4_0_affine(const uint8_t* b, uint8_t* q, float* s, float* o) {
  s[0] = f16_at(b);
  o[0] = -8.0f * s[0];
  for (int j = 0; j < 32; ++j) q[j] = nibble32(b + 2, j);
}

void q4_1_affine(const uint8_t* b, uint8_t* q, float* s, float* o) {
  s[0] = f16_at(b);
  o[0] = f16_at(b + 2);
  for (int j = 0; j < 32; ++j) q[j] = nibble32(b + 4, j);
}

void q5_0_affine(const uint8_t* b, uint8_t* q, float* s, float* o) {
  s[0] = f16_at(b);
  o[0] = -16.0f * s[0];
  for (int j = 0; j < 32; ++j) q[j] = uint8_t(nibble32(b + 6, j) | qh_bit(b + 2, j) << 4);
}

void q5_1_affine(const uint8_t* b, uint8_t* q, float* s, float* o) {
  s[0] = f16_at(b);
  o[0] = f16_at(b + 2);
  for (int j = 0; j < 32; ++j) q[j] = uint8_t(nibble32(b + 8, j) | qh_bit(b + 4, j) << 4);
}

// Signed codes shifted by 128 into unsigned ones.
void q8_0_affine(const uint8_t* b, uint8_t* q, float* s, float* o) {
  s[0] = f16_at(b);
  o[0] = -128.0f * s[0];
  for (int j = 0; j < 32; ++j) q[j] = uint8_t(b[2 + j] ^ 0x80);
}

void q2_k_affine(const uint8_t* b, uint8_t* q, float* s, float* o) {
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (int g = 0; g < 16; ++g) {
    s[g] = d * float(b[g] & 0x0f);
    o[g] = -(dmin * float(b[g] >> 4));
  }
  for (int e = 0; e < 256; ++e) q[e] = uint8_t(q2_k_code(b + 16, e));
}

void q3_k_affine(const uint8_t* b, uint8_t* q, float* s, float* o) {
  q3_k_scales(b, s);
  for (int g = 0; g < 16; ++g) o[g] = -4.0f * s[g];
  for (int e = 0; e < 256; ++e) q[e] = uint8_t(q3_k_code4(b, e));
}

void k_affine_scales(const uint8_t* b, float* s, float* o) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  uint8_t sc[8], mn[8];
  k_scale_min(b + 4, sc, mn);
  for (int g = 0; g < 8; ++g) {
    s[g] = d * float(sc[g]);
    o[g] = -(dmin * float(mn[g]));
  }
}

void q4_k_affine(const uint8_t* b, uint8_t* q, float* s, float* o) {
  k_affine_scales(b, s, o);
  for (int g = 0; g < 8; ++g)
    for (int l = 0; l < 32; ++l) q[32 * g + l] = uint8_t(k_nibble(b + 16, g, l));
}

void q5_k_affine(const uint8_t* b, uint8_t* q, float* s, float* o) {
  k_affine_scales(b, s, o);
  for (int g = 0; g < 8; ++g)
    for (int l = 0; l < 32; ++l) q[32 * g + l] = uint8_t(q5_k_code(b, g, l));
}

void q6_k_affine(const uint8_t* b, uint8_t* q, float* s, float* o) {
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (int g = 0; g < 16; ++g) {
    s[g] = d * float(sc[g]);
    o[g] = -32.0f * s[g];
  }
  for (int e = 0; e < 256; ++e) q[e] = uint8_t(q6_k_code(b, e));
}

struct AffineType {
  GgmlType type;
  GgmlAffineForm form;
  AffineBlock block;
};

constexpr AffineType kAffine[] = {
    {GgmlType::Q4_0, {4, 32}, q4_0_affine}, {GgmlType::Q4_1, {4, 32}, q4_1_affine},
    {GgmlType::Q4_K, {4, 32}, q4_k_affine}, {GgmlType::Q5_0, {8, 32}, q5_0_affine},
    {GgmlType::Q5_1, {8, 32}, q5_1_affine}, {GgmlType::Q5_K, {8, 32}, q5_k_affine},
    {GgmlType::Q8_0, {8, 32}, q8_0_affine}, {GgmlType::Q2_K, {8, 16}, q2_k_affine},
    {GgmlType::Q3_K, {8, 16}, q3_k_affine}, {GgmlType::Q6_K, {8, 16}, q6_k_affine},
};

const AffineType* affine_type(GgmlType t) {
  for (const AffineType& a : kAffine)
    if (a.type == t) return &a;
  return nullptr;
}

}  // namespace

const GgmlTypeInfo* ggml_type_by_id(uint32_t id) {
  for (const GgmlTypeInfo& t : kTypes)
    if (uint32_t(t.type) == id) return &t;
  return nullptr;
}

const GgmlTypeInfo& ggml_type_info(GgmlType t) { return *ggml_type_by_id(uint32_t(t)); }

std::string ggml_dequantized_type_list() {
  // In the order of the types' families (float, legacy, K-quants, non-linear), not by id.
  const GgmlType order[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,  GgmlType::Q4_0,
                            GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K,  GgmlType::Q3_K,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
  std::string s;
  for (GgmlType t : order) s += (s.empty() ? "" : ", ") + std::string(ggml_type_name(t));
  return s;
}

void ggml_dequantize_row(GgmlType t, const void* src, int64_t n, float* dst) {
  const uint8_t* b = static_cast<const uint8_t*>(src);
  switch (t) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::F16: convert_to_f32(src, DType::F16, size_t(n), dst); return;
    case GgmlType::BF16: convert_to_f32(src, DType::BF16, size_t(n), dst); return;
    default: break;
  }
  void (*block)(const uint8_t*, float*) = nullptr;
  switch (t) {
    case GgmlType::Q4_0: block = q4_0; break;
    case GgmlType::Q4_1: block = q4_1; break;
    case GgmlType::Q5_0: block = q5_0; break;
    case GgmlType::Q5_1: block = q5_1; break;
    case GgmlType::Q8_0: block = q8_0; break;
    case GgmlType::Q2_K: block = q2_k; break;
    case GgmlType::Q3_K: block = q3_k; break;
    case GgmlType::Q4_K: block = q4_k; break;
    case GgmlType::Q5_K: block = q5_k; break;
    case GgmlType::Q6_K: block = q6_k; break;
    case GgmlType::IQ4_NL: block = iq4_nl; break;
    case GgmlType::IQ4_XS: block = iq4_xs; break;
    default:
      throw Error(std::string("ggml type ") + ggml_type_name(t) + " cannot be decoded (Petrel decodes " +
                  ggml_dequantized_type_list() + ")");
  }
  const GgmlTypeInfo& info = ggml_type_info(t);
  for (int64_t i = 0; i < n / info.block; ++i) block(b + i * info.bytes, dst + i * info.block);
}

GgmlAffineForm ggml_affine_form(GgmlType t) {
  const AffineType* a = affine_type(t);
  return a ? a->form : GgmlAffineForm{};
}

void ggml_iq4_row(GgmlType t, const void* src, int64_t n, uint32_t* codes, float* scales) {
  check(ggml_is_iq4(t), std::string("ggml type ") + ggml_type_name(t) + " is not an IQ4 type");
  const GgmlTypeInfo& info = ggml_type_info(t);
  const uint8_t* b = static_cast<const uint8_t*>(src);
  uint8_t q[256];
  std::fill_n(codes, n / 8, 0u);
  for (int64_t i = 0; i < n / info.block; ++i) {
    const uint8_t* block = b + i * info.bytes;
    if (t == GgmlType::IQ4_NL) scales[i] = iq4_nl_codes(block, q);
    else iq4_xs_codes(block, q, scales + i * 8);
    for (int64_t j = 0; j < info.block; ++j) {
      const int64_t e = i * info.block + j;
      codes[e / 8] |= uint32_t(q[j]) << (4 * (e % 8));
    }
  }
}

void ggml_affine_row(GgmlType t, const void* src, int64_t n, uint32_t* codes, float* scales, float* biases) {
  const AffineType* a = affine_type(t);
  check(a != nullptr, std::string("ggml type ") + ggml_type_name(t) + " has no affine form");
  const GgmlTypeInfo& info = ggml_type_info(t);
  const int bits = a->form.bits, per_word = 32 / bits, per_block = int(info.block / a->form.group);
  const uint8_t* b = static_cast<const uint8_t*>(src);
  uint8_t q[256];
  std::fill_n(codes, n / per_word, 0u);
  for (int64_t i = 0; i < n / info.block; ++i) {
    a->block(b + i * info.bytes, q, scales + i * per_block, biases + i * per_block);
    for (int64_t j = 0; j < info.block; ++j) {
      const int64_t e = i * info.block + j;
      codes[e / per_word] |= uint32_t(q[j]) << (bits * (e % per_word));
    }
  }
}

}  // namespace petrel
