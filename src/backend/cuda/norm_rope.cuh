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

// One warp: head p (D values) normalised with weights w, then its first `rotary` dims rotated in
// pairs (j, j + rotary/2) by the angles angle(j, sn, cs) gives; the result, rounded to bf16 as it
// would be stored, is left in hv (D floats of shared memory). The head and its weights are one
// round trip.
template <typename Angle>
__device__ __forceinline__ void norm_rope_head_by(const bf16* p, const float* w, int D, float eps, int rotary,
                                                  Angle angle, float* hv) {
  const int lane = threadIdx.x % 32, per = D / 32;
  float v[kNormRopeMaxPer], wv[kNormRopeMaxPer];
#pragma unroll
  for (int i = 0; i < kNormRopeMaxPer; ++i) {
    v[i] = i < per ? __bfloat162float(p[lane + 32 * i]) : 0.0f;
    wv[i] = i < per ? w[lane + 32 * i] : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormRopeMaxPer; ++i) ss += v[i] * v[i];
  const float inv = rsqrtf(warp_sum(ss) / float(D) + eps);
#pragma unroll
  for (int i = 0; i < kNormRopeMaxPer; ++i)
    if (i < per) hv[lane + 32 * i] = __bfloat162float(__float2bfloat16(v[i] * inv * wv[i]));
  __syncwarp();
  const int half = rotary / 2;
#pragma unroll 1
  for (int j = lane; j < half; j += 32) {
    float sn, cs;
    angle(j, sn, cs);
    const float x0 = hv[j], x1 = hv[j + half];
    hv[j] = __bfloat162float(__float2bfloat16(x0 * cs - x1 * sn));
    hv[j + half] = __bfloat162float(__float2bfloat16(x1 * cs + x0 * sn));
  }
  __syncwarp();
}

// norm_rope_head_by with the angles worked out in place, at `position`.
__device__ __forceinline__ void norm_rope_head(const bf16* p, const float* w, int D, float eps, int rotary,
                                               float theta, float position, float* hv) {
  norm_rope_head_by(p, w, D, eps, rotary,
                    [&](int j, float& sn, float& cs) { rope_angle(j, rotary, theta, position, sn, cs); }, hv);
}

}  // namespace petrel::cuda
