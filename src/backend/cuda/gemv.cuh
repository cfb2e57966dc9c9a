// Building blocks of the decode matrix-vector kernels (dense GEMV and the MoE experts). A block
// stages its activation rows in shared memory as fp32, padded so that lanes reading neighbouring
// chunks hit distinct banks, together with each chunk's Σx; weights then stream from HBM in
// 16-byte chunks (32 4-bit, 16 8-bit or 8 bf16 weights), several rows in flight per lane.
#pragma once
#include "backend/cuda/common.cuh"

namespace petrel::cuda {

// Weights in one 16-byte chunk of a row.
__host__ __device__ constexpr int chunk_weights(WFormat f) {
  return f == WFormat::Q4 ? 32 : f == WFormat::Q8 ? 16 : 8;
}
// Floats between consecutive chunks' activations in shared memory: 4 of padding keeps the
// 16-byte reads of 8 neighbouring lanes on distinct banks.
__host__ __device__ constexpr int chunk_pitch(WFormat f) { return chunk_weights(f) + 4; }

// True when a row splits into whole chunks that never straddle a quantisation group.
inline bool chunked_layout(const DeviceMatrix& m) {
  const int cw = chunk_weights(m.format);
  return m.cols % cw == 0 && (m.format == WFormat::BF16 || m.group % cw == 0);
}

// Shared memory for `rows` staged activation rows of a `cols`-wide matrix of format f.
inline size_t staged_bytes(WFormat f, int cols, int rows) {
  const int chunks = cols / chunk_weights(f);
  return size_t(rows) * chunks * (chunk_pitch(f) + 1) * sizeof(float);
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

// Σ w·x over one chunk; xs points at the chunk's staged activations, xsum is their sum.
template <WFormat F>
__device__ __forceinline__ float dot_chunk(const Chunk& ch, const float* xs, float xsum) {
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
  } else if constexpr (F == WFormat::Q4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 xa = x4[2 * i], xb = x4[2 * i + 1];
      const uint32_t w = words[i];
      a0 = fmaf(small_uint_to_float(w & 15u), xa.x, a0);
      a1 = fmaf(small_uint_to_float((w >> 4) & 15u), xa.y, a1);
      a0 = fmaf(small_uint_to_float((w >> 8) & 15u), xa.z, a0);
      a1 = fmaf(small_uint_to_float((w >> 12) & 15u), xa.w, a1);
      a0 = fmaf(small_uint_to_float((w >> 16) & 15u), xb.x, a0);
      a1 = fmaf(small_uint_to_float((w >> 20) & 15u), xb.y, a1);
      a0 = fmaf(small_uint_to_float((w >> 24) & 15u), xb.z, a0);
      a1 = fmaf(small_uint_to_float(w >> 28), xb.w, a1);
    }
    return ch.scale * (a0 + a1) + ch.bias * xsum;
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

// Staged activations: rows of `chunks` chunks at chunk_pitch floats each, then every chunk's Σx.
template <WFormat F>
struct Staged {
  const float* xs;
  const float* sums;
  int chunks;
  __device__ const float* chunk(int row, int c) const {
    return xs + (int64_t(row) * chunks + c) * chunk_pitch(F);
  }
  __device__ float sum(int row, int c) const { return sums[row * chunks + c]; }
};

// Whole block: copies `rows` activation rows (bf16 or fp32) into shared memory and sums each
// chunk. row_src(r) gives row r's first element index in x. Ends with __syncthreads().
template <WFormat F, typename RowSrc>
__device__ Staged<F> stage_rows(float* smem, const void* x, int x_elem, int cols, int rows, RowSrc row_src) {
  constexpr int cw = chunk_weights(F), pitch = chunk_pitch(F);
  const int chunks = cols / cw;
  float* xs = smem;
  float* sums = smem + rows * chunks * pitch;
  for (int r = 0; r < rows; ++r) {
    const int64_t src = row_src(r);
    if (src % 8 == 0) {  // 16-byte loads, 8 elements per thread (chunks are multiples of 8 wide)
#pragma unroll 4
      for (int i = 8 * threadIdx.x; i < cols; i += 8 * blockDim.x) {
        float v[8];
        load8_x(x, x_elem, src + i, v);
        float* dst = xs + (int64_t(r) * chunks + i / cw) * pitch + i % cw;
        reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
      }
    } else {
      for (int i = threadIdx.x; i < cols; i += blockDim.x)
        xs[(int64_t(r) * chunks + i / cw) * pitch + i % cw] = load_act(x, x_elem, src + i);
    }
  }
  __syncthreads();
  if constexpr (F != WFormat::BF16) {
    for (int rc = threadIdx.x; rc < rows * chunks; rc += blockDim.x) {
      const float* p = xs + int64_t(rc) * pitch;
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < cw; ++i) s += p[i];
      sums[rc] = s;
    }
    __syncthreads();
  }
  return Staged<F>{xs, sums, chunks};
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
