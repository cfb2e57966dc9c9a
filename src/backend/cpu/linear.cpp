// CPU matrix kernels: fp32 math over weights decoded one row block at a time (bf16 or MLX codes
// are never expanded for the whole matrix).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/kernels.h"

namespace petrel::cpu {

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void linear(const float* x, int64_t x_stride, int64_t T, const Matrix& w, float* y, int64_t y_stride) {
  constexpr int64_t kRowBlock = 8;  // weight rows decoded together, reused across all T inputs
  const int64_t rows = w.rows, cols = w.cols;
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  // Threads only pay off past ~64K multiply-adds; below that their start-up dominates (tiny models).
#pragma omp parallel if (rows * cols * T >= (1 << 16))
  {
    std::vector<float> wbuf(size_t(kRowBlock * cols));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b * kRowBlock, nr = std::min(kRowBlock, rows - r0);
      for (int64_t r = 0; r < nr; ++r) w.dequant_row(r0 + r, wbuf.data() + r * cols);
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * x_stride;
        float* yt = y + t * y_stride + r0;
        for (int64_t r = 0; r < nr; ++r) yt[r] = dot(xt, wbuf.data() + r * cols, cols);
      }
    }
  }
}

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* out) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(float(ss / double(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

void rope_neox(float* head, int rotary_dim, int pos, float theta) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    // HF: inv_freq = 1 / theta^(2i/R) in fp32, angle = pos · inv_freq in fp32.
    const float inv_freq = 1.0f / std::pow(theta, float(2 * i) / float(rotary_dim));
    const float angle = float(pos) * inv_freq;
    const float c = std::cos(angle), s = std::sin(angle);
    const float x0 = head[i], x1 = head[i + half];
    head[i] = x0 * c - x1 * s;
    head[i + half] = x1 * c + x0 * s;
  }
}

}  // namespace petrel::cpu
