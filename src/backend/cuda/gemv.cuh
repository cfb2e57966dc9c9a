// Building blocks of the decode matrix-vector kernels (dense GEMV and the MoE experts). A block
// stages its activation rows in shared memory as fp32, padded so that lanes reading neighbouring
// chunks hit distinct banks, together with each chunk's Σx; weights then stream from HBM in
// 16-byte chunks (32 4-bit, 16 8-bit or 8 bf16 weights), several rows in flight per lane.
#pragma once
#include <cuda_fp16.h>

#include "backend/cuda/common.cuh"

namespace petrel::cuda {

// Weights in one 16-byte chunk of a row.
__host__ __device__ constexpr int chunk_weights(WFormat f) {
  return f == WFormat::Q4 ? 32 : f == WFormat::Q8 ? 16 : 8;
}
// Floats of shared memory between consecutive chunks' staged activations. bf16 and 8-bit
// weights meet fp32 activations (plus 4 floats of padding); 4-bit weights meet fp16 pairs (16
// floats' worth, plus 4). The padding keeps the 16-byte reads of 8 neighbouring lanes on
// distinct banks.
__host__ __device__ constexpr int chunk_pitch(WFormat f) { return f == WFormat::Q4 ? 20 : chunk_weights(f) + 4; }

// True when a row splits into whole chunks that never straddle a quantisation group.
inline bool chunked_layout(const DeviceMatrix& m) {
  const int cw = chunk_weights(m.format);
  return m.cols % cw == 0 && (m.format == WFormat::BF16 || m.group % cw == 0);
}

// Shared memory for `rows` staged activation rows of a `cols`-wide matrix of format f: the
// chunks, each chunk's Σx, and a scale per row.
inline size_t staged_bytes(WFormat f, int cols, int rows) {
  const int chunks = cols / chunk_weights(f);
  return (size_t(rows) * chunks * (chunk_pitch(f) + 1) + rows) * sizeof(float);
}

// Exact float of v < 2^23 without the quarter-rate integer-to-float conversion.
__device__ __forceinline__ float small_uint_to_float(uint32_t v) {
  return __int_as_float(0x4B000000u | v) - 8388608.0f;
}

struct Chunk {
  uint4 raw;
  float scale, bias;  // of the chunk's quantisation group (unused for bf16)
};

template <WFormat F>
__device__ __forceinline__ Chunk load_chunk(const DeviceMatrix& m, int64_t row, int c) {
  constexpr int cw = chunk_weights(F);
  const int chunks = m.cols / cw;
  Chunk ch;
  ch.raw = __ldg(reinterpret_cast<const uint4*>(m.w) + row * chunks + c);
  if constexpr (F != WFormat::BF16) {
    const int64_t gi = row * (m.cols / m.group) + int64_t(c) * cw / m.group;
    ch.scale = __bfloat162float(m.scales[gi]);
    ch.bias = __bfloat162float(m.biases[gi]);
  }
  return ch;
}

// Σ (q-8)·x over 32 4-bit codes in fp16 pairs: each code pair becomes the exact half2
// (1024+q, 1024+q') with one mask-and-or, minus 1032; products accumulate in two half2 chains
// of 8 (magnitudes stay below 2^16 because staging scales x to |x| <= 512).
__device__ __forceinline__ float dot_q4_centered(const uint4& raw, const float* xs) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  const uint4* x16 = reinterpret_cast<const uint4*>(xs);
  const __half2 magic = __floats2half2_rn(1032.0f, 1032.0f);
  __half2 acc0 = __floats2half2_rn(0.0f, 0.0f), acc1 = acc0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 xv = x16[i];  // x of the word's codes, ordered (0,4) (1,5) (2,6) (3,7)
    const uint32_t w = words[i];
    const uint32_t p[4] = {(w & 0x000F000Fu) | 0x64006400u, ((w >> 4) & 0x000F000Fu) | 0x64006400u,
                           ((w >> 8) & 0x000F000Fu) | 0x64006400u, ((w >> 12) & 0x000F000Fu) | 0x64006400u};
    const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __half2 q = __hsub2(*reinterpret_cast<const __half2*>(&p[j]), magic);
      __half2& acc = j % 2 ? acc1 : acc0;
      acc = __hfma2(q, *reinterpret_cast<const __half2*>(&xw[j]), acc);
    }
  }
  const float2 a = __half22float2(acc0), b = __half22float2(acc1);
  return (a.x + a.y) + (b.x + b.y);
}

// Σ w·x over one chunk of bf16 or 8-bit weights; xs points at the chunk's fp32 activations.
template <WFormat F>
__device__ __forceinline__ float dot_chunk_f32(const Chunk& ch, const float* xs, float xsum) {
  const uint32_t words[4] = {ch.raw.x, ch.raw.y, ch.raw.z, ch.raw.w};
  const float4* x4 = reinterpret_cast<const float4*>(xs);
  float a0 = 0.0f, a1 = 0.0f;  // two chains hide the FMA latency
  if constexpr (F == WFormat::BF16) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float4 x = x4[i];
      const float2 w0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[2 * i]));
      const float2 w1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[2 * i + 1]));
      a0 = fmaf(w0.x, x.x, a0);
      a1 = fmaf(w0.y, x.y, a1);
      a0 = fmaf(w1.x, x.z, a0);
      a1 = fmaf(w1.y, x.w, a1);
    }
    return a0 + a1;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 x = x4[i];
      const uint32_t w = words[i];
      a0 = fmaf(small_uint_to_float(w & 255u), x.x, a0);
      a1 = fmaf(small_uint_to_float((w >> 8) & 255u), x.y, a1);
      a0 = fmaf(small_uint_to_float((w >> 16) & 255u), x.z, a0);
      a1 = fmaf(small_uint_to_float(w >> 24), x.w, a1);
    }
    return ch.scale * (a0 + a1) + ch.bias * xsum;
  }
}

// Staged activations: rows of `chunks` chunks at chunk_pitch floats each, every chunk's Σx (of
// the unscaled fp32 values) and, for 4-bit, the factor each row was scaled down by.
template <WFormat F>
struct Staged {
  const float* xs;
  const float* sums;
  const float* unscale;
  int chunks;
  __device__ const float* chunk(int row, int c) const {
    return xs + (int64_t(row) * chunks + c) * chunk_pitch(F);
  }
  // Σ w·x of chunk c of activation row `row` with the weights in ch.
  __device__ __forceinline__ float dot(const Chunk& ch, int row, int c) const {
    if constexpr (F == WFormat::Q4) {
      // w = s·q + b = s·(q-8) + (b + 8s)
      return ch.scale * unscale[row] * dot_q4_centered(ch.raw, chunk(row, c)) +
             (ch.bias + 8.0f * ch.scale) * sums[row * chunks + c];
    } else {
      return dot_chunk_f32<F>(ch, chunk(row, c), sums[row * chunks + c]);
    }
  }
};

// Loads the 32 activations of chunk c (bf16 or fp32 source) into v.
__device__ __forceinline__ void load32_act(const void* x, int x_elem, int64_t src, float v[32]) {
#pragma unroll
  for (int g = 0; g < 4; ++g) load8_x(x, x_elem, src + 8 * g, v + 8 * g);
}

// Exponent k >= 0 with m·2^-k <= 512, for scaling fp16 activations away from overflow.
__device__ __forceinline__ int fp16_safe_shift(float m) {
  if (!(m > 512.0f) || isinf(m)) return 0;
  int e = 0;
  frexpf(m / 512.0f, &e);
  return e;
}

// 4-bit staging, one thread per (row, chunk): Σx and the row's max |x| first, then x·2^-k as
// fp16 in code-pair order, with k chosen so that |x·2^-k| <= 512 (no fp16 overflow).
template <typename RowSrc>
__device__ Staged<WFormat::Q4> stage_rows_q4(float* smem, const void* x, int x_elem, int cols, int rows,
                                             RowSrc row_src) {
  const int chunks = cols / 32, n = rows * chunks;
  float* xs = smem;
  float* sums = smem + int64_t(n) * chunk_pitch(WFormat::Q4);
  float* unscale = sums + n;  // holds the max |x| bits until the scale is known
  for (int r = threadIdx.x; r < rows; r += blockDim.x) unscale[r] = 0.0f;
  __syncthreads();
  for (int p = threadIdx.x; p < n; p += blockDim.x) {
    float v[32];
    load32_act(x, x_elem, row_src(p / chunks) + int64_t(p % chunks) * 32, v);
    float s = 0.0f, m = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s += v[i];
      m = fmaxf(m, fabsf(v[i]));
    }
    sums[p] = s;
    atomicMax(reinterpret_cast<int*>(unscale) + p / chunks, __float_as_int(m));  // m >= 0: int order = float order
  }
  __syncthreads();
  for (int p = threadIdx.x; p < n; p += blockDim.x) {
    const float down = ldexpf(1.0f, -fp16_safe_shift(unscale[p / chunks]));
    float v[32];
    load32_act(x, x_elem, row_src(p / chunks) + int64_t(p % chunks) * 32, v);
    uint4* dst = reinterpret_cast<uint4*>(xs + int64_t(p) * chunk_pitch(WFormat::Q4));
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const float* e = v + 8 * g;
      __half2 h[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn(e[j] * down, e[j + 4] * down);
      dst[g] = *reinterpret_cast<const uint4*>(h);
    }
  }
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) unscale[r] = ldexpf(1.0f, fp16_safe_shift(unscale[r]));
  __syncthreads();
  return Staged<WFormat::Q4>{xs, sums, unscale, chunks};
}

// Whole block: copies `rows` activation rows (bf16 or fp32) into shared memory as the format's
// Staged layout. row_src(r) gives row r's first element index in x (a multiple of 8). Ends with
// __syncthreads().
template <WFormat F, typename RowSrc>
__device__ Staged<F> stage_rows(float* smem, const void* x, int x_elem, int cols, int rows, RowSrc row_src) {
  if constexpr (F == WFormat::Q4) {
    return stage_rows_q4(smem, x, x_elem, cols, rows, row_src);
  } else {
    constexpr int cw = chunk_weights(F), pitch = chunk_pitch(F);
    const int chunks = cols / cw;
    float* xs = smem;
    float* sums = smem + rows * chunks * pitch;
    for (int r = 0; r < rows; ++r) {
      const int64_t src = row_src(r);
#pragma unroll 4
      for (int i = 8 * threadIdx.x; i < cols; i += 8 * blockDim.x) {  // chunks are multiples of 8 wide
        float v[8];
        load8_x(x, x_elem, src + i, v);
        float* dst = xs + (int64_t(r) * chunks + i / cw) * pitch + i % cw;
        reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
      }
    }
    __syncthreads();
    if constexpr (F == WFormat::Q8) {
      for (int rc = threadIdx.x; rc < rows * chunks; rc += blockDim.x) {
        const float* p = xs + int64_t(rc) * pitch;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < cw; ++i) s += p[i];
        sums[rc] = s;
      }
      __syncthreads();
    }
    return Staged<F>{xs, sums, nullptr, chunks};
  }
}

// Sum over the `width` lanes (a power of two) of each aligned lane group.
__device__ __forceinline__ float group_sum(float v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Lanes sharing one row: the largest power of two <= min(32, chunks).
inline int lanes_per_row(int chunks) {
  int l = 1;
  while (l < 32 && l * 2 <= chunks) l *= 2;
  return l;
}

// Multiprocessors of the current device (cached).
int sm_count();

}  // namespace petrel::cuda
