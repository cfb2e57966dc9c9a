// One attention head's q/k norm and RoPE as one warp computes it: qk_norm_rope_kernel
// (norm_rope.cu) runs it over whole q and k tensors, the decode attention kernel (attention.cu)
// on the heads it reads, so both give the same bits. The pieces are apart so that a kernel can
// load its weights and angles before its dependency wait and its heads' values in one round trip.
#pragma once

#include <type_traits>

#include "backend/cuda/common.cuh"

namespace petrel::cuda {

// Lane's elements lane + 32·i (i < D / 32) of a head or of its norm weights; MAXPER >= D / 32.
template <int MAXPER, typename T>
__device__ __forceinline__ void load_head_slice(const T* x, int D, float (&v)[MAXPER], int lane) {
#pragma unroll
  for (int i = 0; i < MAXPER; ++i) {
    if constexpr (std::is_same_v<T, bf16>) v[i] = i < D / 32 ? __bfloat162float(x[lane + 32 * i]) : 0.0f;
    else v[i] = i < D / 32 ? x[lane + 32 * i] : 0.0f;
  }
}

// The cos and sin of rotary pair j's angle at `position`: fp32 as HF computes them.
__device__ __forceinline__ void rope_angle(int j, int rotary, float theta, float position, float* cs, float* sn) {
  const float inv_freq = 1.0f / powf(theta, float(2 * j) / float(rotary));
  sincosf(position * inv_freq, sn, cs);
}

// The (cos, sin) of rotary pairs j = first, first + step, .. < rotary / 2 into cs_sn[2j], cs_sn[2j + 1].
__device__ __forceinline__ void rope_angles(float* cs_sn, int rotary, float theta, float position, int first,
                                            int step) {
  for (int j = first; j < rotary / 2; j += step) rope_angle(j, rotary, theta, position, &cs_sn[2 * j], &cs_sn[2 * j + 1]);
}

// One NeoX pair rotated, without contractions: both paths round alike.
__device__ __forceinline__ void rotate_pair(float& x0, float& x1, float cs, float sn) {
  const float y0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
  x1 = __fadd_rn(__fmul_rn(x1, cs), __fmul_rn(x0, sn));
  x0 = y0;
}

// RMSNorm of a loaded head (v, weights w), each value rounded to bf16 as it would be stored.
template <int MAXPER>
__device__ __forceinline__ void norm_lane(float (&v)[MAXPER], const float (&w)[MAXPER], int D, float eps) {
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < MAXPER; ++i) ss += v[i] * v[i];
  const float inv = rsqrtf(warp_sum(ss) / float(D) + eps);
#pragma unroll
  for (int i = 0; i < MAXPER; ++i) v[i] = __bfloat162float(__float2bfloat16(v[i] * inv * w[i]));
}

// The angles of a lane's rotary pairs j = lane + 32·i, i < rotary / 64 (rope_in_lanes).
template <int MAXPER>
__device__ __forceinline__ void rope_lane_angles(int rotary, float theta, float position, int lane,
                                                 float (&cs)[MAXPER / 2], float (&sn)[MAXPER / 2]) {
#pragma unroll
  for (int i = 0; i < MAXPER / 2; ++i)
    if (i < rotary / 64) rope_angle(lane + 32 * i, rotary, theta, position, &cs[i], &sn[i]);
}

// norm_rope_loaded's result in the lane's own slots v[i] (element lane + 32·i), where
// rope_in_lanes(rotary): no shared memory and no warp barriers.
template <int MAXPER>
__device__ __forceinline__ void norm_rope_lane(float (&v)[MAXPER], const float (&w)[MAXPER], int D, float eps,
                                               int rotary, const float (&cs)[MAXPER / 2],
                                               const float (&sn)[MAXPER / 2]) {
  norm_lane(v, w, D, eps);
  const int pairs = rotary / 64;  // slot i pairs with slot i + pairs
#pragma unroll
  for (int i = 0; i < MAXPER / 2; ++i)
#pragma unroll
    for (int p = 1; p < MAXPER; ++p)
      if (i < pairs && p == i + pairs) rotate_pair(v[i], v[p], cs[i], sn[i]);
}

// One warp: RMSNorm of a loaded head (v, weights w) rounded to bf16 as it would be stored, then
// the NeoX rotation of dims j and j + rotary/2 by the angles rope_angles gave, into hv[0..D)
// (shared memory). hv's values are floats; storing them as bf16 gives the rotated head.
template <int MAXPER>
__device__ __forceinline__ void norm_rope_loaded(float (&v)[MAXPER], const float (&w)[MAXPER], int D, float eps,
                                                 const float* cs_sn, int rotary, float* hv, int lane) {
  norm_lane(v, w, D, eps);
#pragma unroll
  for (int i = 0; i < MAXPER; ++i)
    if (i < D / 32) hv[lane + 32 * i] = v[i];
  __syncwarp();
  const int half = rotary / 2;
  for (int j = lane; j < half; j += 32) rotate_pair(hv[j], hv[j + half], cs_sn[2 * j], cs_sn[2 * j + 1]);
  __syncwarp();
}

// Eight rotated values hv[0..8) as the bf16 chunk a 16-byte store writes.
__device__ __forceinline__ uint4 pack8_bf16(const float* hv) {
  uint4 r;
  uint32_t* w = reinterpret_cast<uint32_t*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(hv[2 * i], hv[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&p);
  }
  return r;
}

}  // namespace petrel::cuda
