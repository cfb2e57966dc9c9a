#include "model/weights.h"

#include <algorithm>

#include "core/fp8.h"

namespace petrel {
namespace {

// Index of the scale of stored row sr's first block in an Fp8 matrix's scale grid.
int64_t fp8_scale_row(const Matrix& m, int64_t sr) {
  const Fp8Blocks& b = m.fp8;
  const int64_t row = b.first_row + sr;
  const int64_t slab = row / b.slab_rows, in_slab = row % b.slab_rows;
  return (slab * b.grid_rows() + in_slab / b.block_rows) * b.grid_cols(m.cols);
}

// Row sr of an Fp8 matrix: each code's value times the scale of its block.
void dequant_fp8_row(const Matrix& m, int64_t sr, float* out) {
  const Fp8Blocks& b = m.fp8;
  const int64_t grid_cols = b.grid_cols(m.cols), scale0 = fp8_scale_row(m, sr);
  const uint8_t* codes = static_cast<const uint8_t*>(m.data) + sr * m.cols;
  for (int64_t g = 0; g < grid_cols; ++g) {
    const float s = load_as_f32(m.scales, m.dtype, scale0 + g);
    const int64_t end = std::min(m.cols, (g + 1) * b.block_cols);
    for (int64_t i = g * b.block_cols; i < end; ++i) out[i] = kE4m3Values[codes[i]] * s;
  }
}

}  // namespace

float Matrix::fp8_scale(int64_t sr, int64_t col) const {
  return load_as_f32(scales, dtype, fp8_scale_row(*this, sr) + col / fp8.block_cols);
}

void Matrix::dequant_row(int64_t r, float* out) const {
  const int64_t sr = stored_row(r);
  if (format == MatrixFormat::Dense) {
    const size_t es = dtype_size(dtype);
    convert_to_f32(static_cast<const uint8_t*>(data) + size_t(sr) * cols * es, dtype, cols, out);
    return;
  }
  if (format == MatrixFormat::Gguf) {
    ggml_dequantize_row(ggml, static_cast<const uint8_t*>(data) + sr * ggml_row_bytes(ggml, cols), cols, out);
    return;
  }
  if (format == MatrixFormat::Fp8) {
    dequant_fp8_row(*this, sr, out);
    return;
  }
  const int64_t words_per_row = cols * bits / 32;
  const int64_t groups = cols / group;
  const uint32_t* w = static_cast<const uint32_t*>(data) + sr * words_per_row;
  const int per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  for (int64_t g = 0; g < groups; ++g) {
    const float s = load_as_f32(scales, dtype, sr * groups + g);
    const float b = load_as_f32(biases, dtype, sr * groups + g);
    for (int64_t i = g * group; i < (g + 1) * group; ++i) {
      const uint32_t q = (w[i / per_word] >> ((i % per_word) * bits)) & mask;
      out[i] = s * float(q) + b;
    }
  }
}

size_t Matrix::bytes() const {
  if (format == MatrixFormat::Dense) return size_t(rows * cols) * dtype_size(dtype);
  if (format == MatrixFormat::Gguf) return size_t(rows * ggml_row_bytes(ggml, cols));
  if (format == MatrixFormat::Fp8) {
    const int64_t block_rows_spanned = (rows + fp8.block_rows - 1) / fp8.block_rows;
    return size_t(rows * cols) + size_t(block_rows_spanned * fp8.grid_cols(cols)) * dtype_size(dtype);
  }
  return size_t(rows * cols * bits / 8) + 2 * size_t(rows * (cols / group)) * dtype_size(dtype);
}

Matrix Matrix::slice_rows(int64_t row0, int64_t nrows) const {
  Matrix s = *this;
  s.rows = nrows;
  switch (format) {
    case MatrixFormat::Dense:
      s.data = static_cast<const uint8_t*>(data) + size_t(row0 * cols) * dtype_size(dtype);
      break;
    case MatrixFormat::Gguf:
      s.data = static_cast<const uint8_t*>(data) + size_t(row0 * ggml_row_bytes(ggml, cols));
      break;
    case MatrixFormat::Fp8:
      s.data = static_cast<const uint8_t*>(data) + size_t(row0 * cols);
      s.fp8.first_row = fp8.first_row + row0;
      break;
    case MatrixFormat::Affine: {
      s.data = static_cast<const uint32_t*>(data) + row0 * (cols * bits / 32);
      const size_t off = size_t(row0 * (cols / group)) * dtype_size(dtype);
      s.scales = static_cast<const uint8_t*>(scales) + off;
      s.biases = static_cast<const uint8_t*>(biases) + off;
      break;
    }
  }
  return s;
}

}  // namespace petrel
