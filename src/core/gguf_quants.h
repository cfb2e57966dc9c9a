// ggml tensor types as GGUF files store them: names, block sizes, and rows decoded to fp32 exactly
// as gguf-py's `gguf.quants.dequantize` decodes them (tests/unit/gguf_quants_test.cpp holds the
// two to the same bits).
#pragma once
#include <cstdint>
#include <string>

namespace petrel {

// ggml's type ids (ggml.h `enum ggml_type`); the gaps are ids ggml has retired.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41, Q2_0 = 42,
};

// A type's storage: `block` consecutive elements of a row take `bytes` bytes.
struct GgmlTypeInfo {
  GgmlType type;
  const char* name;  // as ggml and gguf-py spell it: "Q4_K", "BF16"
  int64_t block;
  int64_t bytes;
  bool dequantized;  // Petrel decodes it (ggml_dequantize_row)
};

// The storage of type id `id`, or null for an id ggml does not (or no longer) define.
const GgmlTypeInfo* ggml_type_by_id(uint32_t id);
const GgmlTypeInfo& ggml_type_info(GgmlType t);
inline const char* ggml_type_name(GgmlType t) { return ggml_type_info(t).name; }
// The types Petrel decodes, for messages: "F32, F16, BF16, Q8_0, ...".
std::string ggml_dequantized_type_list();

// Bytes of a row of `n` elements; n must be a multiple of the type's block.
inline int64_t ggml_row_bytes(GgmlType t, int64_t n) {
  const GgmlTypeInfo& info = ggml_type_info(t);
  return n / info.block * info.bytes;
}

// Decodes a row of `n` elements (a multiple of the block) stored at `src` into `dst`, bit for bit
// as gguf-py's dequantize does. `t` must be one of the dequantized types.
void ggml_dequantize_row(GgmlType t, const void* src, int64_t n, float* dst);

// The affine form of a type whose blocks are x = scale·q + bias per group of elements with
// unsigned integer codes q: the form the device kernels read (4-bit codes for the 4-bit types,
// 8-bit codes for the 5-, 6- and 8-bit ones and for the K-quants with 16-element groups). bits 0:
// the type has none (floats; IQ4_NL and IQ4_XS, whose levels are not evenly spaced).
struct GgmlAffineForm {
  int bits = 0;
  int group = 0;
};
GgmlAffineForm ggml_affine_form(GgmlType t);

// Row `src` of n elements in its type's affine form: codes packed into 32-bit words (element i at
// bits [bits·(i % per_word), ...) of word i / per_word, MLX's order), a scale and a bias per
// group. For finite scales, scale·q + bias (two fp32 roundings) equals ggml_dequantize_row's value.
void ggml_affine_row(GgmlType t, const void* src, int64_t n, uint32_t* codes, float* scales, float* biases);

// The 16 non-uniform levels of IQ4_NL and IQ4_XS (gguf-py IQ4_NL.kvalues).
inline constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// True for IQ4_NL and IQ4_XS, whose blocks are x = scale·kIq4Levels[q] per group of 32 elements.
inline bool ggml_is_iq4(GgmlType t) { return t == GgmlType::IQ4_NL || t == GgmlType::IQ4_XS; }
// Row `src` of n elements of an IQ4 type as 4-bit codes, packed as ggml_affine_row packs them, and
// a scale per 32 elements: scale·kIq4Levels[q] (one fp32 product) is ggml_dequantize_row's value.
void ggml_iq4_row(GgmlType t, const void* src, int64_t n, uint32_t* codes, float* scales);

}  // namespace petrel
