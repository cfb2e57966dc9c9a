#include "core/gguf_quants.h"

#include <cstddef>

namespace petrel {
namespace {

constexpr int64_t kQK_K = 256;  // elements of a K-quant super-block

// ggml's type traits (ggml.c `type_traits`; gguf-py constants.py GGML_QUANT_SIZES).
constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::F32, "F32", 1, 4},
    {GgmlType::F16, "F16", 1, 2},
    {GgmlType::Q4_0, "Q4_0", 32, 2 + 16},
    {GgmlType::Q4_1, "Q4_1", 32, 2 + 2 + 16},
    {GgmlType::Q5_0, "Q5_0", 32, 2 + 4 + 16},
    {GgmlType::Q5_1, "Q5_1", 32, 2 + 2 + 4 + 16},
    {GgmlType::Q8_0, "Q8_0", 32, 2 + 32},
    {GgmlType::Q8_1, "Q8_1", 32, 4 + 4 + 32},
    {GgmlType::Q2_K, "Q2_K", kQK_K, 2 + 2 + kQK_K / 16 + kQK_K / 4},
    {GgmlType::Q3_K, "Q3_K", kQK_K, 2 + kQK_K / 4 + kQK_K / 8 + 12},
    {GgmlType::Q4_K, "Q4_K", kQK_K, 2 + 2 + kQK_K / 2 + 12},
    {GgmlType::Q5_K, "Q5_K", kQK_K, 2 + 2 + kQK_K / 2 + kQK_K / 8 + 12},
    {GgmlType::Q6_K, "Q6_K", kQK_K, 2 + kQK_K / 2 + kQK_K / 4 + kQK_K / 16},
    {GgmlType::Q8_K, "Q8_K", kQK_K, 4 + kQK_K + kQK_K / 8},
    {GgmlType::IQ2_XXS, "IQ2_XXS", kQK_K, 2 + kQK_K / 4},
    {GgmlType::IQ2_XS, "IQ2_XS", kQK_K, 2 + kQK_K / 4 + kQK_K / 32},
    {GgmlType::IQ3_XXS, "IQ3_XXS", kQK_K, 2 + kQK_K / 4 + kQK_K / 8},
    {GgmlType::IQ1_S, "IQ1_S", kQK_K, 2 + kQK_K / 8 + kQK_K / 16},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 2 + 16},
    {GgmlType::IQ3_S, "IQ3_S", kQK_K, 2 + kQK_K / 4 + kQK_K / 8 + kQK_K / 32 + 4},
    {GgmlType::IQ2_S, "IQ2_S", kQK_K, 2 + kQK_K / 4 + kQK_K / 16},
    {GgmlType::IQ4_XS, "IQ4_XS", kQK_K, 2 + 2 + kQK_K / 2 + kQK_K / 64},
    {GgmlType::I8, "I8", 1, 1},
    {GgmlType::I16, "I16", 1, 2},
    {GgmlType::I32, "I32", 1, 4},
    {GgmlType::I64, "I64", 1, 8},
    {GgmlType::F64, "F64", 1, 8},
    {GgmlType::IQ1_M, "IQ1_M", kQK_K, kQK_K / 8 + kQK_K / 16 + kQK_K / 32},
    {GgmlType::BF16, "BF16", 1, 2},
    {GgmlType::TQ1_0, "TQ1_0", kQK_K, 2 + 4 * 13},
    {GgmlType::TQ2_0, "TQ2_0", kQK_K, 2 + 64},
    {GgmlType::MXFP4, "MXFP4", 32, 1 + 16},
    {GgmlType::NVFP4, "NVFP4", 64, 4 + 32},
    {GgmlType::Q1_0, "Q1_0", 128, 2 + 16},
    {GgmlType::Q2_0, "Q2_0", 64, 2 + 16},
};

}  // namespace

const GgmlTypeInfo* ggml_type_by_id(uint32_t id) {
  for (const GgmlTypeInfo& t : kTypes)
    if (uint32_t(t.type) == id) return &t;
  return nullptr;
}

const GgmlTypeInfo& ggml_type_info(GgmlType t) { return *ggml_type_by_id(uint32_t(t)); }

}  // namespace petrel
