// A Matrix of GGUF blocks: rows decode as gguf-py decodes them (the fixtures of
// gguf_quants_test.cpp), through row maps and slices, and the CPU linear layer reads them.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "backend/cpu/kernels.h"
#include "core/npy.h"
#include "model/weights.h"

namespace petrel {
namespace {

struct Fixture {
  std::vector<uint8_t> raw;  // 4 rows of blocks
  NpyArray want;             // gguf-py's decoding, [4, cols]
  explicit Fixture(GgmlType t) {
    const std::string base = std::string(PETREL_FIXTURES_DIR) + "/gguf/dequant/" + ggml_type_name(t);
    std::ifstream in(base + ".bin", std::ios::binary);
    raw.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    want = read_npy_f32(base + ".npy");
  }
  Matrix matrix(GgmlType t) const {
    Matrix m;
    m.name = "blk.0.ffn_down.weight";
    m.rows = want.shape[0];
    m.cols = want.shape[1];
    m.format = MatrixFormat::Gguf;
    m.ggml = t;
    m.data = raw.data();
    return m;
  }
  std::vector<float> row(int64_t r) const {
    const int64_t n = want.shape[1];
    return {want.data.begin() + r * n, want.data.begin() + (r + 1) * n};
  }
};

std::vector<float> decode(const Matrix& m, int64_t r) {
  std::vector<float> out(static_cast<size_t>(m.cols));
  m.dequant_row(r, out.data());
  return out;
}

TEST(GgufMatrix, RowsDecodeAsGgufPy) {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::IQ4_NL}) {
    const Fixture f(t);
    const Matrix m = f.matrix(t);
    ASSERT_EQ(int64_t(f.raw.size()), 4 * ggml_row_bytes(t, m.cols));
    EXPECT_EQ(m.bytes(), f.raw.size()) << ggml_type_name(t);
    for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(decode(m, r), f.row(r)) << ggml_type_name(t) << " row " << r;
  }
}

TEST(GgufMatrix, RowMapsAndSlicesPickStoredRows) {
  const Fixture f(GgmlType::Q5_K);
  const Matrix m = f.matrix(GgmlType::Q5_K);
  Matrix gathered = m;
  gathered.rows = 2;
  gathered.row_map = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{3, 1});
  EXPECT_EQ(decode(gathered, 0), f.row(3));
  EXPECT_EQ(decode(gathered, 1), f.row(1));
  const Matrix tail = m.slice_rows(2, 2);
  EXPECT_EQ(tail.rows, 2);
  EXPECT_EQ(tail.bytes(), f.raw.size() / 2);
  EXPECT_EQ(decode(tail, 0), f.row(2));
  EXPECT_EQ(decode(tail, 1), f.row(3));
}

TEST(GgufMatrix, CpuLinearReadsGgufRows) {
  const Fixture f(GgmlType::Q4_0);
  const Matrix m = f.matrix(GgmlType::Q4_0);
  const int64_t T = 3, n = m.cols;
  std::vector<float> x(static_cast<size_t>(T * n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 7) - 3) * 0.25f;
  std::vector<float> y(static_cast<size_t>(T * m.rows));
  cpu::linear(x.data(), n, T, m, y.data(), m.rows);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < m.rows; ++r) {
      const std::vector<float> w = f.row(r);
      EXPECT_EQ(y[size_t(t * m.rows + r)], cpu::dot(x.data() + t * n, w.data(), n)) << "token " << t << " row " << r;
    }
}

}  // namespace
}  // namespace petrel
