// The tensor-core pieces of flash attention shared by the prefill kernel (attention_prefill.cu)
// and the grouped decode kernel (attention.cu): a warp owns 16 query rows and meets a tile of KEYS
// keys at a time, scores, online softmax and output in registers.
//
// Layout (mma.m16n8k16, lane = 4·g + c: g = groupID 0..7, c = thread in group 0..3):
//   Q, K and V tiles are [rows][D] bf16 in shared memory, row-major; the 16-byte chunk k of row r
//   is stored at chunk k ^ (r & 7), so the 8 row addresses of each ldmatrix phase fall in 8
//   distinct bank groups. S = Q·Kᵀ: A = Q by ldmatrix.x4 (lane l addresses row l%16, column
//   8·(l/16)); B = K rows as columns (non-transposed ldmatrix.x4: key 8·(l/16) + l%8, column
//   8·((l/8)%2) gives b0,b1 of keys 0-7 then b0,b1 of keys 8-15).
//   C fragment of an 8-key block: lane holds rows g (c0, c1) and g+8 (c2, c3), keys 2c and 2c+1,
//   so the row max and sum reduce over the 4 lanes of a quad.
//   O += P·V: the C fragments of key blocks 2k and 2k+1, packed to bf16 pairs, are exactly the A
//   fragment of keys 16k..16k+15; B = V by ldmatrix.x4.trans (lane l addresses key l%16, column
//   8·(l/16): b0,b1 of dims 0-7 then b0,b1 of dims 8-15).
#pragma once
#include "backend/cuda/mma.cuh"

namespace petrel::cuda {

// Byte offset of (row, col) in a swizzled [rows][D] bf16 tile; col is a multiple of 8. The XOR is
// confined to the 64-column group so unrolled loops fold the group into an immediate.
template <int D>
__device__ __forceinline__ uint32_t swz(int row, int col) {
  return 2u * uint32_t(row * D + (col & ~63) + ((((col >> 3) & 7) ^ (row & 7)) << 3));
}

__device__ __forceinline__ float exp2_approx(float x) {  // 2^x; -inf gives 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// s = (the 16 query rows from row q0 of sQ)·Kᵀ over KEYS keys (a multiple of 8), raw dot products.
template <int D, int KEYS>
__device__ __forceinline__ void scores(uint32_t sQ, uint32_t sK, int q0, int lane, float s[KEYS / 8][4]) {
#pragma unroll
  for (int n = 0; n < KEYS / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, sQ + swz<D>(q0 + lane % 16, 16 * kk + 8 * (lane / 16)));
#pragma unroll
    for (int np = 0; np < KEYS / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, sK + swz<D>(16 * np + 8 * (lane / 16) + lane % 8, 16 * kk + 8 * ((lane / 8) % 2)));
      mma_bf16(s[2 * np], a, b[0], b[1]);
      mma_bf16(s[2 * np + 1], a, b[2], b[3]);
    }
    if constexpr (KEYS % 16 == 8) {  // the last 8 keys: lanes 0-15 address their two matrices
      uint32_t b[2];
      ldmatrix_x2(b, sK + swz<D>(KEYS - 8 + lane % 8, 16 * kk + 8 * ((lane / 8) % 2)));
      mma_bf16(s[KEYS / 8 - 1], a, b[0], b[1]);
    }
  }
}

// Both tiles' scores of one key block: s[t] = (the 16 query rows of sQ)·Kᵀ over the 8 keys at
// sK[t], raw dot products; each k step's Q fragment serves the two (two independent mma chains).
template <int D>
__device__ __forceinline__ void scores_pair(uint32_t sQ, const uint32_t (&sK)[2], int lane, float s[2][4]) {
#pragma unroll
  for (int t = 0; t < 2; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, sQ + swz<D>(lane % 16, 16 * kk + 8 * (lane / 16)));
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      uint32_t b[2];
      ldmatrix_x2(b, sK[t] + swz<D>(lane % 8, 16 * kk + 8 * ((lane / 8) % 2)));
      mma_bf16(s[t], a, b[0], b[1]);
    }
  }
}

// The whole tile's scores in every warp, from each warp's share: warp w scored its KW keys into
// `mine`, fragment b being keys [W·w + F·b, +8) (W = KW, F = 8: the warp's keys in one run), and
// leaves with all KEYS keys in s (the same C layout), through sS ([16][KEYS + 8] floats). Without
// UPPER rows 8-15 hold no query: only rows 0-7 are shared and s's upper elements are zero. Whole
// block; sS is free again after the block's next barrier.
template <int KEYS, int KW, int W = KW, int F = 8, bool UPPER = true>
__device__ __forceinline__ void share_scores(float* sS, const float mine[KW / 8][4], int warp, int lane,
                                             float s[KEYS / 8][4]) {
  constexpr int P = KEYS + 8;
  const int g = lane / 4, c = 2 * (lane % 4);
#pragma unroll
  for (int b = 0; b < KW / 8; ++b) {
    const int col = W * warp + F * b + c;
    *reinterpret_cast<float2*>(sS + g * P + col) = make_float2(mine[b][0], mine[b][1]);
    if (UPPER) *reinterpret_cast<float2*>(sS + (g + 8) * P + col) = make_float2(mine[b][2], mine[b][3]);
  }
  __syncthreads();
#pragma unroll
  for (int b = 0; b < KEYS / 8; ++b) {
    const float2 lo = *reinterpret_cast<const float2*>(sS + g * P + 8 * b + c);
    const float2 hi = UPPER ? *reinterpret_cast<const float2*>(sS + (g + 8) * P + 8 * b + c) : make_float2(0.0f, 0.0f);
    s[b][0] = lo.x;
    s[b][1] = lo.y;
    s[b][2] = hi.x;
    s[b][3] = hi.y;
  }
}

// The scores of a tile's keys from n on (past the range) to -inf: they weigh nothing.
template <int KEYS>
__device__ __forceinline__ void mask_keys_from(float s[KEYS / 8][4], int n, int lane) {
  if (n >= KEYS) return;
#pragma unroll
  for (int b = 0; b < KEYS / 8; ++b)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (8 * b + 2 * (lane % 4) + (e & 1) >= n) s[b][e] = -INFINITY;
}

// Online softmax over one key tile: turns s into p = 2^(s·scale_log2 - m) in place, rescales the
// running sums l (this lane's share) and the output o (NT fragments of 8 dims) to the new row
// maxima m (raw scores). Without UPPER rows 8-15 hold no query: their p are zero, their m, l and o
// untouched.
template <int KEYS, int NT, bool UPPER = true>
__device__ __forceinline__ void online_softmax(float s[KEYS / 8][4], float m[2], float l[2], float o[NT][4],
                                               float scale_log2) {
  if (!UPPER)
#pragma unroll
    for (int n = 0; n < KEYS / 8; ++n) s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int r = 0; r < (UPPER ? 2 : 1); ++r) {  // rows g and g+8: elements 2r and 2r+1 of each fragment
    float mx = m[r];
#pragma unroll
    for (int n = 0; n < KEYS / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float base = mx == -INFINITY ? 0.0f : mx * scale_log2;  // no visible key yet: p stays 0
    const float corr = exp2_approx(m[r] * scale_log2 - base);
    m[r] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < KEYS / 8; ++n)
#pragma unroll
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        s[n][e] = exp2_approx(fmaf(s[n][e], scale_log2, -base));
        sum += s[n][e];
      }
    l[r] = l[r] * corr + sum;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      o[n][2 * r] *= corr;
      o[n][2 * r + 1] *= corr;
    }
  }
}

// o += p·V over KEYS keys for dims [d0, d0 + 8·NT) (NT even), p rounded to bf16.
template <int D, int KEYS, int NT>
__device__ __forceinline__ void accumulate_pv(const float p[KEYS / 8][4], uint32_t sV, int lane, int d0,
                                              float o[NT][4]) {
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk) {
    const uint32_t a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                           pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < NT / 2; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, sV + swz<D>(16 * kk + lane % 16, d0 + 16 * dp + 8 * (lane / 16)));
      mma_bf16(o[2 * dp], a, b[0], b[1]);
      mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

}  // namespace petrel::cuda
