// CPU causal GQA attention over the KV cache (fp32 softmax).
#include <omp.h>

#include <cmath>
#include <vector>

#include "backend/cpu/kernels.h"

namespace petrel::cpu {

void attention(const float* q, int64_t q_stride, int T, int n_past, const float* kc, const float* vc, int Hq,
               int Hkv, int D, float* out, int64_t out_stride) {
  const int group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t kv_stride = int64_t(Hkv) * D;
#pragma omp parallel if (int64_t(T) * Hq * (n_past + T) * D >= (1 << 16))
  {
    std::vector<float> p(size_t(n_past + T));
#pragma omp for collapse(2) schedule(static)
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < Hq; ++h) {
        const int kvh = h / group;
        const float* qh = q + t * q_stride + int64_t(h) * D;
        const int n = n_past + t + 1;  // keys visible to this query
        float mx = -INFINITY;
        for (int s = 0; s < n; ++s) {
          p[s] = dot(qh, kc + s * kv_stride + int64_t(kvh) * D, D) * scale;
          mx = std::max(mx, p[s]);
        }
        double sum = 0.0;
        for (int s = 0; s < n; ++s) {
          p[s] = std::exp(p[s] - mx);
          sum += p[s];
        }
        const float inv = float(1.0 / sum);
        float* o = out + t * out_stride + int64_t(h) * D;
        for (int d = 0; d < D; ++d) o[d] = 0.0f;
        for (int s = 0; s < n; ++s) {
          const float ps = p[s] * inv;
          const float* vs = vc + s * kv_stride + int64_t(kvh) * D;
          for (int d = 0; d < D; ++d) o[d] += ps * vs[d];
        }
      }
    }
  }
}

}  // namespace petrel::cpu
