#include "model/weights.h"

namespace petrel {

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
