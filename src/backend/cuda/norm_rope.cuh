// One attention head's RMSNorm and NeoX RoPE by one warp: qk_norm_rope (norm_rope.cu) and the
// short-context decode attention (attention.cu) both call it, so their q and k are the same bits.
#pragma once
#include "backend/cuda/common.cuh"

namespace petrel::cuda {

constexpr int kNormRopeMaxPer = 16;  // D / 32: head_dim up to 512

// The NeoX rotation's sine and cosine of pair j at `position`: θ^(-2j/rotary)·position, in fp32
// as HF computes it.
__device__ __forceinline__ void rope_angle(int j, int rotary, float theta, float position, float& sn, float& cs) {
  const float inv_freq = 1.0f / powf(theta, float(2 * j) / float(rotary));
  sincosf(position * inv_freq, &sn, &cs);
}

// Whole block: the sines and cosines of pairs j < rotary/2 at `position` into sn, cs (shared
// memory; read after the block's next barrier). They need the position alone, so a decode kernel
// builds them before its PDL wait.
__device__ __forceinline__ void rope_table(int rotary, float theta, float position, float* sn, float* cs) {
#pragma unroll 1
  for (int j = threadIdx.x; j < rotary / 2; j += blockDim.x) rope_angle(j, rotary, theta, position, sn[j], cs[j]);
}

// One warp: heads p[0..n) (n <= N; D values each) normalised with weights w[i], then their first
// `rotary` dims rotated in pairs (j, j + rotary/2) by the angles angle(j, sn, cs) gives; each
// result, rounded to bf16 as it would be stored, is left in hv[i] (D floats of shared memory). A
// head and its weights are one round trip, and the heads' chains run side by side (two heads
// take little longer than one); each head's bits are those of a warp with that head alone.
template <int N, typename Angle>
__device__ __forceinline__ void norm_rope_heads_by(const bf16* const (&p)[N], const float* const (&w)[N], int n,
                                                   int D, float eps, int rotary, Angle angle, float* const (&hv)[N]) {
  const int lane = threadIdx.x % 32, per = D / 32;
  float v[N][kNormRopeMaxPer], wv[N][kNormRopeMaxPer];
#pragma unroll
  for (int h = 0; h < N; ++h)
#pragma unroll
    for (int i = 0; i < kNormRopeMaxPer; ++i) {
      v[h][i] = h < n && i < per ? __bfloat162float(p[h][lane + 32 * i]) : 0.0f;
      wv[h][i] = h < n && i < per ? w[h][lane + 32 * i] : 0.0f;
    }
  float ss[N];
#pragma unroll
  for (int h = 0; h < N; ++h) {
    ss[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < kNormRopeMaxPer; ++i) ss[h] += v[h][i] * v[h][i];
  }
#pragma unroll
  for (int h = 0; h < N; ++h) {
    const float inv = rsqrtf(warp_sum(ss[h]) / float(D) + eps);
#pragma unroll
    for (int i = 0; i < kNormRopeMaxPer; ++i)
      if (h < n && i < per) hv[h][lane + 32 * i] = __bfloat162float(__float2bfloat16(v[h][i] * inv * wv[h][i]));
  }
  __syncwarp();
  const int half = rotary / 2;
#pragma unroll 1
  for (int j = lane; j < half; j += 32) {
    float sn, cs;
    angle(j, sn, cs);
#pragma unroll
    for (int h = 0; h < N; ++h) {
      if (h >= n) continue;
      const float x0 = hv[h][j], x1 = hv[h][j + half];
      hv[h][j] = __bfloat162float(__float2bfloat16(x0 * cs - x1 * sn));
      hv[h][j + half] = __bfloat162float(__float2bfloat16(x1 * cs + x0 * sn));
    }
  }
  __syncwarp();
}

// One warp: norm_rope_heads_by of the one head p, its result in hv.
template <typename Angle>
__device__ __forceinline__ void norm_rope_head_by(const bf16* p, const float* w, int D, float eps, int rotary,
                                                  Angle angle, float* hv) {
  const bf16* const ps[1] = {p};
  const float* const ws[1] = {w};
  float* const hvs[1] = {hv};
  norm_rope_heads_by<1>(ps, ws, 1, D, eps, rotary, angle, hvs);
}

// norm_rope_head_by with the angles worked out in place, at `position`.
__device__ __forceinline__ void norm_rope_head(const bf16* p, const float* w, int D, float eps, int rotary,
                                               float theta, float position, float* hv) {
  norm_rope_head_by(p, w, D, eps, rotary,
                    [&](int j, float& sn, float& cs) { rope_angle(j, rotary, theta, position, sn, cs); }, hv);
}

}  // namespace petrel::cuda
