// e4m3 codes decode bit for bit, and fp8 matrices multiply each code by its own block's scale:
// partial edge blocks, stacked slabs with a grid each, slices that start inside a block, row gathers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/fp8.h"
#include "model/weights.h"

namespace petrel {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The e4m3 definition written out independently: (-1)^s · 2^(e-7) · (1 + m/8), or 2^-6 · m/8 for e = 0.
double e4m3_reference(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(E4m3, EveryCodeDecodesExactly) {
  for (int c = 0; c < 256; ++c) {
    const float got = kE4m3Values[size_t(c)];
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      EXPECT_TRUE(e4m3_is_nan(uint8_t(c)));
      continue;
    }
    EXPECT_FALSE(e4m3_is_nan(uint8_t(c)));
    const float want = float(e4m3_reference(c));
    EXPECT_EQ(double(want), e4m3_reference(c)) << "code " << c << " is not exact in fp32";
    EXPECT_EQ(bits_of(got), bits_of(want)) << "code " << c << ": " << got << " vs " << want;
  }
}

// The GPU kernels' decode (e4m3_top_bits): any code in a word's top byte, whatever the lower bytes
// hold, gives its exact value times 2^-120, subnormals included.
TEST(E4m3, TopByteBitsAreEveryCodesValueScaledDown) {
  std::mt19937 rng(7);
  for (int c = 0; c < 256; ++c) {
    if (e4m3_is_nan(uint8_t(c))) continue;
    for (int trial = 0; trial < 4; ++trial) {
      const uint32_t w = uint32_t(c) << 24 | (trial == 0 ? 0u : rng() & 0xFFFFFFu);
      float f;
      const uint32_t b = e4m3_top_bits(w);
      std::memcpy(&f, &b, 4);
      EXPECT_EQ(bits_of(f * kE4m3TopUnscale), bits_of(kE4m3Values[size_t(c)])) << "code " << c << " word " << w;
    }
  }
}

TEST(E4m3, KnownValues) {
  EXPECT_EQ(kE4m3Values[0x7e], 448.0f);                     // the largest finite value
  EXPECT_EQ(kE4m3Values[0xfe], -448.0f);
  EXPECT_EQ(kE4m3Values[0x08], 0.015625f);                  // smallest normal, 2^-6
  EXPECT_EQ(kE4m3Values[0x01], 0.001953125f);               // smallest subnormal, 2^-9
  EXPECT_EQ(kE4m3Values[0x07], 7 * 0.001953125f);           // largest subnormal
  EXPECT_EQ(kE4m3Values[0x38], 1.0f);
  EXPECT_EQ(kE4m3Values[0x3c], 1.5f);
  EXPECT_EQ(bits_of(kE4m3Values[0x80]), 0x80000000u);       // negative zero keeps its sign
}

TEST(E4m3, NanScanFindsTheFirstNanCode) {
  std::vector<uint8_t> codes(37);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i * 5 % 0x7f);  // codes 0..126: no NaN
  EXPECT_EQ(find_e4m3_nan(codes.data(), codes.size()), codes.size());
  codes[3] = 0x7e;
  codes[4] = 0xfe;
  EXPECT_EQ(find_e4m3_nan(codes.data(), codes.size()), codes.size());
  for (size_t at : {size_t(0), size_t(7), size_t(8), size_t(21), size_t(36)}) {
    for (uint8_t nan : {uint8_t(0x7f), uint8_t(0xff)}) {
      std::vector<uint8_t> c = codes;
      c[at] = nan;
      if (at + 3 < c.size()) c[at + 3] = 0xff;
      EXPECT_EQ(find_e4m3_nan(c.data(), c.size()), at) << "NaN at " << at;
    }
  }
}

TEST(E4m3, EncodingRoundsToNearestEven) {
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) EXPECT_EQ(e4m3_from_f32(kE4m3Values[size_t(c)]), c) << "code " << c;
  for (int c = 0; c < 126; ++c) {  // between neighbours: the nearer one, or the even code at the midpoint
    const float lo = kE4m3Values[size_t(c)], hi = kE4m3Values[size_t(c + 1)];
    const float mid = (lo + hi) / 2;  // exact: the neighbours differ in their last bits only
    EXPECT_EQ(e4m3_from_f32(mid), c % 2 == 0 ? c : c + 1) << "midpoint above code " << c;
    EXPECT_EQ(e4m3_from_f32(std::nextafter(mid, lo)), c);
    EXPECT_EQ(e4m3_from_f32(std::nextafter(mid, hi)), c + 1);
    EXPECT_EQ(e4m3_from_f32(-std::nextafter(mid, hi)), 0x80 | (c + 1));
  }
  EXPECT_EQ(e4m3_from_f32(1e-30f), 0x00);  // below half the smallest subnormal
  EXPECT_EQ(e4m3_from_f32(1000.0f), 0x7e);
  EXPECT_EQ(e4m3_from_f32(-1000.0f), 0xfe);
  EXPECT_EQ(e4m3_from_f32(NAN), 0x7f);
}

// A stack of `slabs` [rows, cols] fp8 matrices with block scales of `scale_dtype`, and the value
// every weight must decode to, computed here from the definition.
struct Fp8Stack {
  int slabs, rows, cols, br, bc;
  DType scale_dtype;
  std::vector<uint8_t> codes;
  std::vector<uint16_t> scales16;
  std::vector<float> scales32, want;

  Fp8Stack(int slabs_, int rows_, int cols_, int br_, int bc_, DType dt)
      : slabs(slabs_), rows(rows_), cols(cols_), br(br_), bc(bc_), scale_dtype(dt) {
    std::mt19937 rng(7);
    const int gr = (rows + br - 1) / br, gc = (cols + bc - 1) / bc;
    for (int i = 0; i < slabs * gr * gc; ++i) {
      const float s = std::ldexp(1.0f + float(i % 5) / 8.0f, i % 7 - 9);  // exact in bf16 as well
      scales32.push_back(s);
      scales16.push_back(f32_to_bf16(s));
    }
    for (int e = 0; e < slabs; ++e)
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          uint8_t code = uint8_t(rng() & 0xff);
          if ((code & 0x7f) == 0x7f) code = 0x42;
          codes.push_back(code);
          const float s = scales32[size_t((e * gr + r / br) * gc + c / bc)];
          want.push_back(float(e4m3_reference(code)) * s);
        }
  }

  Matrix matrix() const {
    Matrix m;
    m.name = "stack";
    m.rows = int64_t(slabs) * rows;
    m.cols = cols;
    m.format = MatrixFormat::Fp8;
    m.dtype = scale_dtype;
    m.data = codes.data();
    m.scales = scale_dtype == DType::F32 ? static_cast<const void*>(scales32.data()) : scales16.data();
    m.fp8 = Fp8Blocks{br, bc, rows, 0};
    return m;
  }

  void expect_row(const Matrix& m, int64_t r, int64_t tensor_row) const {
    std::vector<float> got(size_t(cols), NAN);
    m.dequant_row(r, got.data());
    for (int c = 0; c < cols; ++c)
      ASSERT_EQ(bits_of(got[size_t(c)]), bits_of(want[size_t(tensor_row * cols + c)]))
          << "row " << r << " (tensor row " << tensor_row << "), column " << c;
  }
};

TEST(Fp8Matrix, EveryRowOfAStackWithPartialBlocks) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const Fp8Stack s(3, 11, 13, 4, 5, dt);  // 11 rows in blocks of 4, 13 columns in blocks of 5
    const Matrix m = s.matrix();
    for (int64_t r = 0; r < m.rows; ++r) s.expect_row(m, r, r);
  }
}

TEST(Fp8Matrix, SlicesStartingInsideABlockKeepTheirScales) {
  const Fp8Stack s(3, 10, 9, 4, 4, DType::F32);
  const Matrix m = s.matrix();
  // A fused gate_up stack split at row 5 of each slab, as one expert's gate and up.
  for (int e = 0; e < 3; ++e) {
    const Matrix gate = m.slice_rows(e * 10, 5), up = m.slice_rows(e * 10 + 5, 5);
    for (int64_t r = 0; r < 5; ++r) {
      s.expect_row(gate, r, e * 10 + r);
      s.expect_row(up, r, e * 10 + 5 + r);
    }
  }
  EXPECT_EQ(m.slice_rows(25, 5).bytes(), size_t(5 * 9) + size_t(2 * 3) * 4);  // rows 25..29 span 2 block rows
}

TEST(Fp8Matrix, RowGathersReadTheStoredRowsScales) {
  const Fp8Stack s(1, 12, 8, 4, 8, DType::F32);
  Matrix m = s.matrix();
  const std::vector<int32_t> order = {11, 0, 4, 7, 8, 3};
  m.row_map = std::make_shared<const std::vector<int32_t>>(order);
  m.rows = int64_t(order.size());
  for (size_t r = 0; r < order.size(); ++r) s.expect_row(m, int64_t(r), order[r]);
}

}  // namespace
}  // namespace petrel
