#include "model/fp8_quantize.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/fp8.h"

namespace petrel {
namespace {

constexpr int kBlock = 128;
constexpr float kFp8Max = 448.0f;

bool converted(const Matrix& m) { return m.valid() && m.data && m.format == MatrixFormat::Dense; }

// Stored rows a view reaches: a row map may cover only part of its tensor.
int64_t stored_rows(const Matrix& m) {
  if (!m.row_map) return m.rows;
  return int64_t(*std::max_element(m.row_map->begin(), m.row_map->end())) + 1;
}

}  // namespace

void for_each_fp8_matrix(ModelWeights& w, const std::function<void(Matrix&)>& fn) {
  if (w.mtp.fc.valid()) fn(w.mtp.fc);
  for (auto* layers : {&w.layers, &w.mtp.layers})
    for (LayerWeights& L : *layers) {
      for (Matrix* m : {&L.attn.q, &L.attn.gate, &L.attn.k, &L.attn.v, &L.attn.o, &L.gdn.qkv, &L.gdn.z, &L.gdn.b,
                        &L.gdn.a, &L.gdn.out, &L.ffn.dense.gate, &L.ffn.dense.up, &L.ffn.dense.down,
                        &L.ffn.shared.gate, &L.ffn.shared.up, &L.ffn.shared.down})
        fn(*m);
      for (MlpWeights& e : L.ffn.experts)
        for (Matrix* m : {&e.gate, &e.up, &e.down}) fn(*m);
    }
}

void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int br, int bc, uint8_t* codes,
                         float* inv_scales) {
  const int64_t grid_cols = (cols + bc - 1) / bc;
  for (int64_t r0 = 0; r0 < rows; r0 += br)
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float scale = amax > 0.0f ? kFp8Max / amax : 1.0f;  // an all-zero block keeps scale 1
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const float scaled = w[r * cols + c] * scale;
          codes[r * cols + c] = e4m3_from_f32(std::clamp(scaled, -kFp8Max, kFp8Max));
        }
      inv_scales[(r0 / br) * grid_cols + c0 / bc] = 1.0f / scale;
    }
}

Fp8Copy::Fp8Copy(const ModelWeights& source) : weights_(source) {
  for_each_fp8_matrix(weights_, [&](Matrix& m) {
    if (converted(m)) stored_[m.data].rows = std::max(stored_[m.data].rows, stored_rows(m));
  });
  for_each_fp8_matrix(weights_, [&](Matrix& m) {
    if (converted(m)) convert(m);
  });
}

void Fp8Copy::convert(Matrix& m) {
  Codes& c = stored_.at(m.data);
  if (c.codes.empty()) {
    Matrix tensor = m;  // the whole stored tensor, rows in stored order
    tensor.row_map = nullptr;
    tensor.rows = c.rows;
    std::vector<float> w(size_t(c.rows * m.cols));
    for (int64_t r = 0; r < c.rows; ++r) tensor.dequant_row(r, w.data() + r * m.cols);
    c.codes.resize(w.size());
    c.scales.resize(size_t(((c.rows + kBlock - 1) / kBlock) * ((m.cols + kBlock - 1) / kBlock)));
    quantize_fp8_blocks(w.data(), c.rows, m.cols, kBlock, kBlock, c.codes.data(), c.scales.data());
  }
  m.format = MatrixFormat::Fp8;
  m.dtype = DType::F32;
  m.data = c.codes.data();
  m.scales = c.scales.data();
  m.fp8 = Fp8Blocks{kBlock, kBlock, c.rows, 0};
}

}  // namespace petrel
