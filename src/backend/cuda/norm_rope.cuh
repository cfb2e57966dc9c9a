// One attention head's q/k RMSNorm + NeoX RoPE, as one warp computes it: shared by the
// qk_norm_rope kernel (norm_rope.cu) and the one-token attention projections that fold it in
// (linear.cu), so both give the same bits.
#pragma once
#include "backend/cuda/common.cuh"

namespace petrel::cuda {

constexpr int kMaxNormRopePerLane = 16;  // head_dim <= 512

// One warp: head p (D values, D % 32 == 0, D <= 512) times rsqrt(mean(p²) + eps)·w, rounded to
// bf16 as it would be stored, then dims j and j + rotary/2 (j < rotary/2) rotated by position·θ^(-2j/rotary)
// (fp32, as HF computes the angle), written back in place. hv: D floats of shared memory for the
// warp. The head is read through L2, so rows other blocks of the same launch wrote are seen.
__device__ __forceinline__ void norm_rope_head(bf16* p, const float* w, int D, float eps, int rotary, float theta,
                                               float position, float* hv) {
  const int lane = threadIdx.x % 32, per = D / 32;
  float v[kMaxNormRopePerLane], wv[kMaxNormRopePerLane];
#pragma unroll
  for (int i = 0; i < kMaxNormRopePerLane; ++i) {  // the head and its norm weights in one round trip
    v[i] = i < per ? __bfloat162float(__ldcg(p + lane + 32 * i)) : 0.0f;
    wv[i] = i < per ? w[lane + 32 * i] : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxNormRopePerLane; ++i) ss += v[i] * v[i];
  const float inv = rsqrtf(warp_sum(ss) / float(D) + eps);
#pragma unroll
  for (int i = 0; i < kMaxNormRopePerLane; ++i)
    if (i < per) hv[lane + 32 * i] = __bfloat162float(__float2bfloat16(v[i] * inv * wv[i]));
  __syncwarp();
  const int half = rotary / 2;
  for (int j = lane; j < half; j += 32) {
    const float inv_freq = 1.0f / powf(theta, float(2 * j) / float(rotary));
    float sn, cs;
    sincosf(position * inv_freq, &sn, &cs);
    const float x0 = hv[j], x1 = hv[j + half];
    hv[j] = x0 * cs - x1 * sn;
    hv[j + half] = x1 * cs + x0 * sn;
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kMaxNormRopePerLane; ++i)
    if (i < per) p[lane + 32 * i] = __float2bfloat16(hv[lane + 32 * i]);
}

}  // namespace petrel::cuda
