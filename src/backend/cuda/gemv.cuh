// Building blocks of the decode matrix-vector kernels (dense GEMV, router and MoE experts). A
// block stages its activation rows in shared memory (fp32, or scaled fp16 for 4-bit weights),
// padded so that lanes reading neighbouring chunks hit distinct banks, together with each chunk's
// Σx; weights then stream from HBM in 16-byte chunks (32 4-bit, 16 8-bit or 8 bf16 weights),
// several rows in flight per lane.
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

// True when a row splits into whole chunks and a quantisation group into a power of two of them.
inline bool chunked_layout(const DeviceMatrix& m) {
  const int cw = chunk_weights(m.format);
  if (m.cols % cw != 0) return false;
  if (m.format == WFormat::BF16) return true;
  const int per_group = m.group / cw;
  return m.group % cw == 0 && (per_group & (per_group - 1)) == 0;
}

// Shared memory for `rows` staged activation rows of a `cols`-wide matrix of format f: the
// chunks, and each chunk's Σx and (4-bit) scale.
inline size_t staged_bytes(WFormat f, int cols, int rows) {
  const int chunks = cols / chunk_weights(f);
  return size_t(rows) * chunks * (chunk_pitch(f) + 2) * sizeof(float);
}

// Exact float of v < 2^23 without the quarter-rate integer-to-float conversion.
__device__ __forceinline__ float small_uint_to_float(uint32_t v) {
  return __int_as_float(0x4B000000u | v) - 8388608.0f;
}

struct Chunk {
  uint4 raw;
  float scale, bias;  // of the chunk's quantisation group (unused for bf16)
};

// A chunked matrix with its index arithmetic settled once: the inner loops do no division.
template <WFormat F>
struct ChunkMatrix {
  const uint4* w;
  const bf16* scales;
  const bf16* biases;
  int chunks, groups, group_shift;  // per row; chunk c lies in quantisation group c >> group_shift

  __device__ __forceinline__ Chunk load(int64_t row, int c) const {
    Chunk ch;
    ch.raw = __ldg(w + row * chunks + c);
    if constexpr (F != WFormat::BF16) {
      const int64_t gi = row * groups + (c >> group_shift);
      ch.scale = __bfloat162float(scales[gi]);
      ch.bias = __bfloat162float(biases[gi]);
    }
    return ch;
  }
  // Starts pulling rows [r0, r1) (weights, scales, biases) into L2.
  __device__ void prefetch_rows(int64_t r0, int64_t r1) const {
    if (r1 <= r0) return;
    prefetch_l2(w + r0 * chunks, size_t(r1 - r0) * chunks * sizeof(uint4));
    if constexpr (F != WFormat::BF16) {
      prefetch_l2(scales + r0 * groups, size_t(r1 - r0) * groups * sizeof(bf16));
      prefetch_l2(biases + r0 * groups, size_t(r1 - r0) * groups * sizeof(bf16));
    }
  }
};

// The same view moved to another matrix of the same shape (a stack entry): no arithmetic redone.
template <WFormat F>
__device__ __forceinline__ ChunkMatrix<F> with_data(ChunkMatrix<F> v, const DeviceMatrix& m) {
  v.w = static_cast<const uint4*>(m.w);
  v.scales = m.scales;
  v.biases = m.biases;
  return v;
}

// The ChunkMatrix view of m (chunked_layout(m) must hold).
template <WFormat F>
__device__ __forceinline__ ChunkMatrix<F> chunk_matrix(const DeviceMatrix& m) {
  constexpr int cw = chunk_weights(F);
  ChunkMatrix<F> v{};
  v.chunks = m.cols / cw;
  v.groups = F == WFormat::BF16 ? 0 : m.cols / m.group;
  v.group_shift = F == WFormat::BF16 ? 0 : __ffs(m.group / cw) - 1;
  return with_data(v, m);
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
// the unscaled fp32 values) and, for 4-bit, the factor each chunk was scaled down by.
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
      const int i = row * chunks + c;
      return ch.scale * unscale[i] * dot_q4_centered(ch.raw, chunk(row, c)) + (ch.bias + 8.0f * ch.scale) * sums[i];
    } else {
      return dot_chunk_f32<F>(ch, chunk(row, c), sums[row * chunks + c]);
    }
  }
};

// Exponent k >= 0 with m·2^-k <= 512, for scaling fp16 activations away from overflow.
__device__ __forceinline__ int fp16_safe_shift(float m) {
  if (!(m > 512.0f) || isinf(m)) return 0;
  int e = 0;
  frexpf(m / 512.0f, &e);
  return e;
}

// Whole block: copies `rows` activation rows (bf16 or fp32) into shared memory as the format's
// Staged layout, in one pass with one barrier at the end. row_src(r) gives row r's first element
// index in x (a multiple of 8). A chunk's activations are split 8 per thread; its threads
// (adjacent lanes) combine Σx and, for 4-bit weights, max |x|, which picks the chunk's scale 2^-k
// (|x·2^-k| <= 512: no fp16 overflow in the dot); 4-bit chunks are stored as fp16 in code-pair order.
template <WFormat F, typename RowSrc>
__device__ Staged<F> stage_rows(float* smem, const void* x, int x_elem, int cols, int rows, RowSrc row_src) {
  constexpr int cw = chunk_weights(F), per_chunk = cw / 8, pitch = chunk_pitch(F);
  const int chunks = cols / cw, n = rows * chunks;
  float* xs = smem;
  float* sums = xs + int64_t(n) * pitch;
  float* unscale = sums + n;
  for (int first = 0; first < n * per_chunk; first += blockDim.x) {  // uniform trip count: shuffles are safe
    const int q = first + threadIdx.x, p = q / per_chunk, part = q % per_chunk;
    const bool active = q < n * per_chunk;
    float v[8] = {};
    if (active) load8_x(x, x_elem, row_src(p / chunks) + int64_t(p % chunks) * cw + 8 * part, v);
    float sum = 0.0f, mx = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      sum += v[i];
      mx = fmaxf(mx, fabsf(v[i]));
    }
#pragma unroll
    for (int o = 1; o < per_chunk; o <<= 1) {
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }
    if (!active) continue;
    float* dst = xs + int64_t(p) * pitch;
    if constexpr (F == WFormat::Q4) {
      const int k = fp16_safe_shift(mx);
      const float down = ldexpf(1.0f, -k);
      __half2 h[4];  // code pairs (j, j+4) of the part's 8 weights
#pragma unroll
      for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn(v[j] * down, v[j + 4] * down);
      reinterpret_cast<uint4*>(dst)[part] = *reinterpret_cast<const uint4*>(h);
      if (part == 0) unscale[p] = ldexpf(1.0f, k);
    } else {
      reinterpret_cast<float4*>(dst + 8 * part)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(dst + 8 * part)[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    if (part == 0) sums[p] = sum;
  }
  __syncthreads();
  return Staged<F>{xs, sums, unscale, chunks};
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
