// ggml row decoding against gguf-py: tests/fixtures/gguf/dequant holds, per type, random rows
// (T.bin) and what gguf-py's gguf.quants.dequantize made of them (T.npy), written by
// tools/gguf/make_dequant_fixtures.py. Petrel must give the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/gguf_quants.h"
#include "core/npy.h"

namespace petrel {
namespace {

const GgmlType kDequantized[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,  GgmlType::Q4_0,
                                 GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K,  GgmlType::Q3_K,
                                 GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class GgufDequant : public ::testing::TestWithParam<GgmlType> {};

TEST_P(GgufDequant, MatchesGgufPyBitForBit) {
  const GgmlType type = GetParam();
  const std::string base = std::string(PETREL_FIXTURES_DIR) + "/gguf/dequant/" + ggml_type_name(type);
  const std::vector<uint8_t> raw = read_bytes(base + ".bin");
  const NpyArray want = read_npy_f32(base + ".npy");
  ASSERT_EQ(want.shape.size(), 2u);
  const int64_t rows = want.shape[0], n = want.shape[1];
  const int64_t row_bytes = ggml_row_bytes(type, n);
  ASSERT_EQ(int64_t(raw.size()), rows * row_bytes) << base;
  std::vector<float> got(static_cast<size_t>(n));
  int64_t mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ggml_dequantize_row(type, raw.data() + r * row_bytes, n, got.data());
    for (int64_t i = 0; i < n; ++i) {
      const float w = want.data[size_t(r * n + i)], g = got[size_t(i)];
      if (std::memcmp(&w, &g, 4) == 0 || (std::isnan(w) && std::isnan(g))) continue;
      if (++mismatches <= 5)
        ADD_FAILURE() << ggml_type_name(type) << " row " << r << " element " << i << ": gguf-py " << w << ", Petrel "
                      << g;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Gguf, GgufDequant, ::testing::ValuesIn(kDequantized),
                         [](const auto& info) { return std::string(ggml_type_name(info.param)); });

const GgmlType kAffine[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q5_1,
                            GgmlType::Q5_K, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q6_K};

class GgufAffine : public ::testing::TestWithParam<GgmlType> {};

// The device kernels read these types as scale·q + bias per group: unpacking the fixture's random
// rows that way must give gguf-py's values to the bit wherever the group's scale and bias are
// finite (random bytes make some f16 scales inf or NaN, whose products the two forms order apart),
// zeros apart: d·(q - c) is -0 where d < 0 and q = c, the sum +0.
TEST_P(GgufAffine, ScaleTimesCodePlusBiasIsGgufPysValue) {
  const GgmlType type = GetParam();
  const GgmlAffineForm form = ggml_affine_form(type);
  ASSERT_TRUE(form.bits == 4 || form.bits == 8) << ggml_type_name(type);
  const std::string base = std::string(PETREL_FIXTURES_DIR) + "/gguf/dequant/" + ggml_type_name(type);
  const std::vector<uint8_t> raw = read_bytes(base + ".bin");
  const NpyArray want = read_npy_f32(base + ".npy");
  const int64_t rows = want.shape[0], n = want.shape[1], row_bytes = ggml_row_bytes(type, n);
  const int per_word = 32 / form.bits;
  std::vector<uint32_t> codes(size_t(n / per_word));
  std::vector<float> scales(size_t(n / form.group)), biases(scales.size());
  int64_t checked = 0, mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ggml_affine_row(type, raw.data() + r * row_bytes, n, codes.data(), scales.data(), biases.data());
    for (int64_t i = 0; i < n; ++i) {
      const float s = scales[size_t(i / form.group)], b = biases[size_t(i / form.group)];
      if (!std::isfinite(s) || !std::isfinite(b)) continue;
      const uint32_t q = (codes[size_t(i / per_word)] >> (form.bits * (i % per_word))) & ((1u << form.bits) - 1);
      const float scaled = s * float(q), got = scaled + b, w = want.data[size_t(r * n + i)];
      ++checked;
      const bool same = std::memcmp(&w, &got, 4) == 0 || (w == 0.0f && got == 0.0f);
      if (!same && ++mismatches <= 5)
        ADD_FAILURE() << ggml_type_name(type) << " row " << r << " element " << i << ": gguf-py " << w
                      << ", affine " << got << " (q " << q << ", scale " << s << ", bias " << b << ")";
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(checked, rows * n / 2) << "too few finite groups to check";
}

INSTANTIATE_TEST_SUITE_P(Gguf, GgufAffine, ::testing::ValuesIn(kAffine),
                         [](const auto& info) { return std::string(ggml_type_name(info.param)); });

class GgufIq4 : public ::testing::TestWithParam<GgmlType> {};

// The device kernels read IQ4_NL and IQ4_XS as scale·level[q] per 32 elements: unpacking the
// fixture's random rows that way must give gguf-py's values to the bit.
TEST_P(GgufIq4, ScaleTimesLevelIsGgufPysValue) {
  const GgmlType type = GetParam();
  ASSERT_TRUE(ggml_is_iq4(type));
  const std::string base = std::string(PETREL_FIXTURES_DIR) + "/gguf/dequant/" + ggml_type_name(type);
  const std::vector<uint8_t> raw = read_bytes(base + ".bin");
  const NpyArray want = read_npy_f32(base + ".npy");
  const int64_t rows = want.shape[0], n = want.shape[1], row_bytes = ggml_row_bytes(type, n);
  std::vector<uint32_t> codes(size_t(n / 8));
  std::vector<float> scales(size_t(n / 32));
  int64_t mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ggml_iq4_row(type, raw.data() + r * row_bytes, n, codes.data(), scales.data());
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t q = (codes[size_t(i / 8)] >> (4 * (i % 8))) & 15u;
      const float got = scales[size_t(i / 32)] * float(kIq4Levels[q]), w = want.data[size_t(r * n + i)];
      const bool same = std::memcmp(&w, &got, 4) == 0 || (std::isnan(w) && std::isnan(got));
      if (!same && ++mismatches <= 5)
        ADD_FAILURE() << ggml_type_name(type) << " row " << r << " element " << i << ": gguf-py " << w << ", iq4 form "
                      << got << " (q " << q << ", scale " << scales[size_t(i / 32)] << ")";
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_THROW(ggml_iq4_row(GgmlType::Q4_0, raw.data(), 32, codes.data(), scales.data()), Error);
}

INSTANTIATE_TEST_SUITE_P(Gguf, GgufIq4, ::testing::Values(GgmlType::IQ4_NL, GgmlType::IQ4_XS),
                         [](const auto& info) { return std::string(ggml_type_name(info.param)); });

TEST(GgufAffineForms, FloatAndNonUniformTypesHaveNone) {
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::IQ4_NL, GgmlType::IQ4_XS})
    EXPECT_EQ(ggml_affine_form(t).bits, 0) << ggml_type_name(t);
  EXPECT_THROW(ggml_affine_row(GgmlType::IQ4_NL, nullptr, 32, nullptr, nullptr, nullptr), Error);
  EXPECT_EQ(ggml_affine_form(GgmlType::Q6_K).group, 16);
  EXPECT_EQ(ggml_affine_form(GgmlType::Q4_K).bits, 4);
}

TEST(GgufTypes, KnowsWhichTypesItDecodes) {
  for (GgmlType t : kDequantized) EXPECT_TRUE(ggml_type_info(t).dequantized) << ggml_type_name(t);
  for (GgmlType t : {GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::IQ2_XXS, GgmlType::IQ1_S, GgmlType::I32, GgmlType::F64,
                     GgmlType::TQ1_0, GgmlType::MXFP4})
    EXPECT_FALSE(ggml_type_info(t).dequantized) << ggml_type_name(t);
  EXPECT_EQ(ggml_dequantized_type_list(),
            "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS");
  EXPECT_EQ(ggml_type_by_id(4), nullptr);
  EXPECT_EQ(ggml_type_by_id(43), nullptr);
  EXPECT_EQ(ggml_type_by_id(12)->type, GgmlType::Q4_K);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_K, 2048), 8 * 144);
  EXPECT_EQ(ggml_row_bytes(GgmlType::BF16, 3), 6);
}

}  // namespace
}  // namespace petrel
