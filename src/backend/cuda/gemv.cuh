// Building blocks of the decode matrix-vector kernels (dense GEMV, router and MoE experts). A
// block stages its activation rows in shared memory (fp32 for bf16 and FP8 weights, two int8
// levels with a scale per chunk for 4- and 8-bit ones), padded so that lanes reading neighbouring
// chunks hit distinct banks, together with each chunk's Σx; weights then stream from HBM in
// 16-byte chunks (32 4-bit, 16 8-bit or FP8, or 8 bf16 weights), several rows in flight per lane.
#pragma once
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/mma.cuh"

#include <numeric>

namespace petrel::cuda {

// Weights in one 16-byte chunk of a row.
__host__ __device__ constexpr int chunk_weights(WFormat f) {
  return f == WFormat::Q4 ? 32 : f == WFormat::Q8 || f == WFormat::F8 ? 16 : 8;
}
// True where activations are staged as two int8 levels for the integer dot-product units (affine
// codes); bf16 and FP8 weights meet fp32 activations.
__host__ __device__ constexpr bool int8_staged(WFormat f) { return f == WFormat::Q4 || f == WFormat::Q8; }
// Floats of shared memory between consecutive chunks' staged activations: fp32 activations take a
// float per weight, two int8 levels a byte per weight each; plus 4 floats of padding, which keeps
// the 16-byte reads of 8 neighbouring lanes on distinct banks.
__host__ __device__ constexpr int chunk_pitch(WFormat f) {
  return int8_staged(f) ? chunk_weights(f) / 2 + 4 : chunk_weights(f) + 4;
}
// Floats from a chunk's first int8 level to its second.
__host__ __device__ constexpr int level_offset(WFormat f) { return chunk_weights(f) / 4; }

// True when a row splits into whole chunks and a quantisation group into a power of two of them.
inline bool chunked_layout(const DeviceMatrix& m) {
  const int cw = chunk_weights(m.format);
  if (m.cols % cw != 0) return false;
  if (m.format == WFormat::BF16) return true;
  const int per_group = m.group / cw;
  return m.group % cw == 0 && (per_group & (per_group - 1)) == 0;
}

// Shared memory for `rows` staged activation rows of a `cols`-wide matrix of format f: the
// chunks, each chunk's Σx and int8 scale, and (for a staged norm) each row's Σx² with the
// per-warp parts it is summed from.
inline size_t staged_bytes(WFormat f, int cols, int rows) {
  const int chunks = cols / chunk_weights(f);
  return (size_t(rows) * chunks * (chunk_pitch(f) + 2) + rows + size_t(rows) * (cols / kNormWarpCols)) *
         sizeof(float);
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

// Starts pulling rows [r0, r1) of m into L2 whatever its format: a kernel's hint for the next
// kernel's weights, which may be stored in another format than its own.
__device__ inline void prefetch_matrix_rows(const DeviceMatrix& m, int64_t r0, int64_t r1) {
  switch (m.format) {
    case WFormat::Q4: return chunk_matrix<WFormat::Q4>(m).prefetch_rows(r0, r1);
    case WFormat::Q8: return chunk_matrix<WFormat::Q8>(m).prefetch_rows(r0, r1);
    case WFormat::F8: return chunk_matrix<WFormat::F8>(m).prefetch_rows(r0, r1);
    case WFormat::BF16: return chunk_matrix<WFormat::BF16>(m).prefetch_rows(r0, r1);
  }
}

// One chunk's staged activations in registers: two int8 levels (4 words each for 4-bit weights,
// x[0..1] the first level, x[2..3] the second; 2 words each for 8-bit: x[0], x[1]) or 8 fp32
// values (bf16 weights: x[0..1]) or 16 (FP8: x[0..3]); with the chunk's Σx and second-level scale
// d/127² (4- and 8-bit).
template <WFormat F>
struct ChunkX {
  uint4 x[F == WFormat::Q4 || F == WFormat::F8 ? 4 : 2];
  float sum, level_scale;
};

// Σ q·(127·x1 + x2) over 32 4-bit codes q and their activations' two int8 levels (x ≈ d·(x1 +
// x2/127)), on the integer dot-product units: the word's low nibbles (even weights) meet each
// level's first activation word, the high ones its second. The high nibbles stay in place (16
// times their codes, one mask instead of a shift and a mask) and each of the four products has its
// own accumulator (four chains of 4 instead of two of 8). Exact: |Σ| < 2^23.
__device__ __forceinline__ int dot_q4_int8x2(const uint4& raw, const uint4 (&x)[4]) {
  const uint32_t hi[8] = {x[0].x, x[0].y, x[0].z, x[0].w, x[1].x, x[1].y, x[1].z, x[1].w};
  const uint32_t lo[8] = {x[2].x, x[2].y, x[2].z, x[2].w, x[3].x, x[3].y, x[3].z, x[3].w};
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  int even_hi = 0, even_lo = 0, odd16_hi = 0, odd16_lo = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t even = words[i] & 0x0F0F0F0Fu, odd16 = words[i] & 0xF0F0F0F0u;
    even_hi = __dp4a(int(even), int(hi[2 * i]), even_hi);
    even_lo = __dp4a(int(even), int(lo[2 * i]), even_lo);
    asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(odd16_hi) : "r"(odd16), "r"(hi[2 * i + 1]));
    asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(odd16_lo) : "r"(odd16), "r"(lo[2 * i + 1]));
  }
  return 127 * (even_hi + (odd16_hi >> 4)) + even_lo + (odd16_lo >> 4);  // the shifts divide exactly
}

// Σ q·(127·x1 + x2) over 16 8-bit codes (unsigned) and their activations' two int8 levels, in
// natural order. Exact: |Σ| < 2^27.
__device__ __forceinline__ int dot_q8_int8x2(const uint4& raw, const uint4 (&x)[2]) {
  const uint32_t hi[4] = {x[0].x, x[0].y, x[0].z, x[0].w}, lo[4] = {x[1].x, x[1].y, x[1].z, x[1].w};
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  int acc_hi = 0, acc_lo = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // unsigned codes times signed activations
    asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(acc_hi) : "r"(words[i]), "r"(hi[i]));
    asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(acc_lo) : "r"(words[i]), "r"(lo[i]));
  }
  return 127 * acc_hi + acc_lo;
}

// Σ w·x over one chunk of 8 bf16 weights and their 8 fp32 activations (x[0..1] as float4 bits).
__device__ __forceinline__ float dot_bf16(const Chunk& ch, const uint4 (&x)[2]) {
  const uint32_t words[4] = {ch.raw.x, ch.raw.y, ch.raw.z, ch.raw.w};
  float a0 = 0.0f, a1 = 0.0f;  // two chains hide the FMA latency
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float4 x4 = make_float4(__uint_as_float(x[i].x), __uint_as_float(x[i].y), __uint_as_float(x[i].z),
                                  __uint_as_float(x[i].w));
    const float2 w0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[2 * i]));
    const float2 w1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[2 * i + 1]));
    a0 = fmaf(w0.x, x4.x, a0);
    a1 = fmaf(w0.y, x4.y, a1);
    a0 = fmaf(w1.x, x4.z, a0);
    a1 = fmaf(w1.y, x4.w, a1);
  }
  return a0 + a1;
}

// Σ e4m3_top(q)·x over one chunk of 16 FP8 codes and their 16 fp32 activations (x[0..3] as float4
// bits): word i holds codes 4i..4i+3, low byte first, each shifted to the top for e4m3_top.
__device__ __forceinline__ float dot_f8(const uint4& raw, const uint4 (&x)[4]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  float a0 = 0.0f, a1 = 0.0f;  // two chains hide the FMA latency
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = words[i];
    a0 = fmaf(e4m3_top(w << 24), __uint_as_float(x[i].x), a0);
    a1 = fmaf(e4m3_top(w << 16), __uint_as_float(x[i].y), a1);
    a0 = fmaf(e4m3_top(w << 8), __uint_as_float(x[i].z), a0);
    a1 = fmaf(e4m3_top(w), __uint_as_float(x[i].w), a1);
  }
  return a0 + a1;
}

// Σ w·x of one chunk of weights with its staged activations.
template <WFormat F>
__device__ __forceinline__ float dot_x(const Chunk& ch, const ChunkX<F>& cx) {
  if constexpr (F == WFormat::BF16) {
    return dot_bf16(ch, cx.x);
  } else if constexpr (F == WFormat::F8) {  // the group's scale is ch.scale + ch.bias (WFormat)
    return (ch.scale + ch.bias) * kE4m3Unscale * dot_f8(ch.raw, cx.x);
  } else {
    // w = s·q + b, x ≈ (d/127)·(127·x1 + x2): Σ w·x = s·(d/127²)·Σ q·(127·x1 + x2) + b·Σx
    int q;
    if constexpr (F == WFormat::Q4) q = dot_q4_int8x2(ch.raw, cx.x);
    else q = dot_q8_int8x2(ch.raw, cx.x);
    return ch.scale * cx.level_scale * float(q) + ch.bias * cx.sum;
  }
}

// Staged activations: rows of `chunks` chunks at chunk_pitch floats each, every chunk's Σx (of
// the fp32 values) and, for 4- and 8-bit weights, the scale d/127 of its second int8 level. Under
// a staged norm, rows hold x·w and row_ss each row's Σx².
template <WFormat F>
struct Staged {
  const float* xs;
  const float* sums;
  const float* level_scale;
  const float* row_ss;  // null: no norm
  int chunks;
  float inv_cols, eps;
  // What a dot product with row `row` is multiplied by: the row's rsqrt(mean(x²) + eps) under a norm.
  __device__ float row_scale(int row) const { return row_ss ? rsqrtf(row_ss[row] * inv_cols + eps) : 1.0f; }
  __device__ const float* chunk(int row, int c) const {
    return xs + (int64_t(row) * chunks + c) * chunk_pitch(F);
  }
  // Chunk c of activation row `row`, loaded to registers.
  __device__ __forceinline__ ChunkX<F> load_x(int row, int c) const {
    ChunkX<F> cx;
    const uint4* p = reinterpret_cast<const uint4*>(chunk(row, c));
    if constexpr (F == WFormat::Q4 || F == WFormat::F8) {
      cx.x[0] = p[0];
      cx.x[1] = p[1];
      cx.x[2] = p[2];
      cx.x[3] = p[3];
    } else {
      cx.x[0] = p[0];
      cx.x[1] = p[1];
    }
    if constexpr (int8_staged(F)) {
      const int i = row * chunks + c;
      cx.sum = sums[i];
      cx.level_scale = level_scale[i];
    }
    return cx;
  }
  // Σ w·x of chunk c of activation row `row` with the weights in ch.
  __device__ __forceinline__ float dot(const Chunk& ch, int row, int c) const { return dot_x<F>(ch, load_x(row, c)); }
};

// One thread's inputs to a pass of stage_rows: its 8 activations and, under a norm, the norm's 8
// weights.
struct StageInputs {
  float v[8] = {}, w[8] = {};
};

// Thread q's inputs to stage_rows (zeros where q is past the last chunk).
template <WFormat F, typename RowSrc>
__device__ __forceinline__ StageInputs stage_inputs(int q, const void* x, int x_elem, int cols, int rows,
                                                    RowSrc row_src, StageNorm norm) {
  constexpr int cw = chunk_weights(F), per_chunk = cw / 8;
  const int chunks = cols / cw, p = q / per_chunk, col = (p % chunks) * cw + 8 * (q % per_chunk);
  StageInputs in;
  if (q >= rows * chunks * per_chunk) return in;
  load8_x(x, x_elem, row_src(p / chunks) + col, in.v);
  if (norm.w) {
    const float4 w0 = __ldg(reinterpret_cast<const float4*>(norm.w + col));
    const float4 w1 = __ldg(reinterpret_cast<const float4*>(norm.w + col) + 1);
    const float ws[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) in.w[i] = ws[i];
  }
  return in;
}

// The inputs of stage_rows' first pass, loaded ahead: a block that issues these loads before its
// weight copies has them in ~1 µs, where loads issued after the copies wait for every copied
// byte to land. Pass the result to stage_rows with the same arguments.
template <WFormat F, typename RowSrc>
__device__ __forceinline__ StageInputs stage_ahead(const void* x, int x_elem, int cols, int rows, RowSrc row_src,
                                                   StageNorm norm = {}) {
  return stage_inputs<F>(threadIdx.x, x, x_elem, cols, rows, row_src, norm);
}
// The inputs of stage_rows' second pass (zeros where it has none), loaded ahead as stage_ahead's.
template <WFormat F, typename RowSrc>
__device__ __forceinline__ StageInputs stage_ahead_second(const void* x, int x_elem, int cols, int rows,
                                                          RowSrc row_src, StageNorm norm = {}) {
  return stage_inputs<F>(threadIdx.x + blockDim.x, x, x_elem, cols, rows, row_src, norm);
}

// Whole block: copies `rows` activation rows (bf16 or fp32) into shared memory as the format's
// Staged layout, in one pass with one barrier at the end. row_src(r) gives row r's first element
// index in x (a multiple of 8). A chunk's activations are split 8 per thread; its threads
// (adjacent lanes) combine Σx and, for 4- and 8-bit weights, max |x|, which sets the chunk's int8
// scale d = max|x|/127: x1 = round(x/d), then the remainder's x2 = round(127·(x - d·x1)/d) (about
// 14 bits in all, above fp16's 11). For 4-bit weights a thread's 8 values of each level are
// stored even ones first (the order dot_q4_int8x2 reads), for 8-bit ones in order.
// Under a norm (cols a multiple of kNormWarpCols: a warp's lanes share a row) x·w is staged, each
// warp stores its Σx² and a row's parts are summed in order, so the norm is the same every run.
// The first AHEAD passes (0-2) take their inputs from `ahead` and `ahead2`.
template <WFormat F, int AHEAD, typename RowSrc>
__device__ Staged<F> stage_rows_from(float* smem, const void* x, int x_elem, int cols, int rows, RowSrc row_src,
                                     StageNorm norm, const StageInputs& ahead, const StageInputs& ahead2) {
  constexpr int cw = chunk_weights(F), per_chunk = cw / 8, pitch = chunk_pitch(F);
  const int chunks = cols / cw, n = rows * chunks;
  float* xs = smem;
  float* sums = xs + int64_t(n) * pitch;
  float* level_scale = sums + n;
  float* row_ss = level_scale + n;
  float* warp_ss = row_ss + rows;  // [rows][cols / kNormWarpCols]: warp pass q / 32's Σx²
  for (int first = 0; first < n * per_chunk; first += blockDim.x) {  // uniform trip count: shuffles are safe
    const int q = first + threadIdx.x, p = q / per_chunk, part = q % per_chunk;
    const bool active = q < n * per_chunk;
    StageInputs in = AHEAD >= 1 && first == 0                ? ahead
                     : AHEAD >= 2 && first == int(blockDim.x) ? ahead2
                                                              : stage_inputs<F>(q, x, x_elem, cols, rows, row_src, norm);
    float* v = in.v;
    if (norm.w) {
      float ss = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
      ss = warp_sum(ss);
      if (active && threadIdx.x % 32 == 0) warp_ss[q / 32] = ss;
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] *= in.w[i];
    }
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
    if constexpr (int8_staged(F)) {
      const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
      uint32_t hi[2] = {}, lo[2] = {};  // the two words of each level
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float t = v[j] * inv;  // in units of d
        const float x1 = rintf(t);
        const int x2 = __float2int_rn((t - x1) * 127.0f);
        const int word = F == WFormat::Q4 ? j % 2 : j / 4, shift = F == WFormat::Q4 ? 8 * (j / 2) : 8 * (j % 4);
        hi[word] |= (uint32_t(int(x1)) & 255u) << shift;
        lo[word] |= (uint32_t(x2) & 255u) << shift;
      }
      reinterpret_cast<uint2*>(dst)[part] = make_uint2(hi[0], hi[1]);
      reinterpret_cast<uint2*>(dst + level_offset(F))[part] = make_uint2(lo[0], lo[1]);
      if (part == 0) level_scale[p] = mx / (127.0f * 127.0f);
    } else {
      reinterpret_cast<float4*>(dst + 8 * part)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(dst + 8 * part)[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    if (part == 0) sums[p] = sum;
  }
  __syncthreads();
  if (norm.w) {  // the parts in a fixed order: float atomics would make the sum differ run to run
    const int parts = cols / kNormWarpCols;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
      float ss = 0.0f;
      for (int i = 0; i < parts; ++i) ss += warp_ss[r * parts + i];
      row_ss[r] = ss;
    }
    __syncthreads();
  }
  return Staged<F>{xs, sums, level_scale, norm.w ? row_ss : nullptr, chunks, 1.0f / float(cols), norm.eps};
}

template <WFormat F, typename RowSrc>
__device__ Staged<F> stage_rows(float* smem, const void* x, int x_elem, int cols, int rows, RowSrc row_src,
                                StageNorm norm = {}) {
  return stage_rows_from<F, 0>(smem, x, x_elem, cols, rows, row_src, norm, StageInputs{}, StageInputs{});
}
// stage_rows with its first pass's inputs loaded ahead (stage_ahead, the same arguments).
template <WFormat F, typename RowSrc>
__device__ Staged<F> stage_rows(float* smem, const void* x, int x_elem, int cols, int rows, RowSrc row_src,
                                StageNorm norm, const StageInputs& ahead) {
  return stage_rows_from<F, 1>(smem, x, x_elem, cols, rows, row_src, norm, ahead, StageInputs{});
}
// stage_rows with its first two passes' inputs loaded ahead (stage_ahead and stage_ahead_second).
template <WFormat F, typename RowSrc>
__device__ Staged<F> stage_rows(float* smem, const void* x, int x_elem, int cols, int rows, RowSrc row_src,
                                StageNorm norm, const StageInputs& ahead, const StageInputs& ahead2) {
  return stage_rows_from<F, 2>(smem, x, x_elem, cols, rows, row_src, norm, ahead, ahead2);
}

// Stores v as element i of o (or adds it, rounded to bf16, where o.add); returns what it stored
// (before any rounding to bf16 output).
__device__ __forceinline__ float write_out(const GemvOut& o, int64_t i, float v) {
  if (o.add) v = load_act(o.y, o.elem, i) + __bfloat162float(__float2bfloat16(v));
  store_act(o.y, o.elem, i, v);
  return v;
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

// ---- Weights copied into shared memory by cp.async (decode GEMV, experts' gate+up) ----

// Rows of a matrix in shared memory: weights (rows x chunks), then scales and biases (rows x groups).
template <WFormat F>
struct AsyncTile {
  const uint4* w;
  const bf16* scales;
  const bf16* biases;
  // The tile of up to `rows` rows of m's shape starting at p.
  __device__ static AsyncTile at(const char* p, int rows, const ChunkMatrix<F>& m) {
    AsyncTile a;
    a.w = reinterpret_cast<const uint4*>(p);
    a.scales = reinterpret_cast<const bf16*>(p + rows * m.chunks * 16);
    a.biases = a.scales + rows * m.groups;
    return a;
  }
  __device__ Chunk load(const ChunkMatrix<F>& m, int row, int c) const {
    Chunk ch;
    ch.raw = w[row * m.chunks + c];
    if constexpr (F != WFormat::BF16) {
      const int gi = row * m.groups + (c >> m.group_shift);
      ch.scale = __bfloat162float(scales[gi]);
      ch.bias = __bfloat162float(biases[gi]);
    }
    return ch;
  }
};

// Bytes of one row's tile data: its chunks and its scales and biases (groups 0 for bf16, as in
// ChunkMatrix).
__host__ __device__ inline int async_row_bytes(int chunks, int groups) { return chunks * 16 + 4 * groups; }
inline int async_row_bytes(const DeviceMatrix& m) {
  return async_row_bytes(m.cols / chunk_weights(m.format), m.format == WFormat::BF16 ? 0 : m.cols / m.group);
}

// Rows whose scales start 16 bytes apart: tiles begin at a multiple of it (copy_rows_async).
inline int async_row_align(const DeviceMatrix& m) {
  return m.format == WFormat::BF16 ? 1 : 8 / std::gcd(m.cols / m.group, 8);
}

// Rows a block of `parts` takes of `rows` (a multiple of the matrix's async row alignment).
inline int rows_per_part(const DeviceMatrix& m, int rows, int parts) {
  const int align = async_row_align(m);
  return div_up(div_up(rows, parts), align) * align;
}

// Whole block: starts copying `bytes` from src to dst in 16-byte pieces (the last one zero-filled).
__device__ __forceinline__ void copy_async(const void* dst, const void* src, int bytes) {
  const char *d = static_cast<const char*>(dst), *s = static_cast<const char*>(src);
  for (int i = 16 * threadIdx.x; i < bytes; i += 16 * blockDim.x)
    cp_async16_part(smem_addr(d + i), s + i, min(16, bytes - i));
}

// Whole block: starts copying rows [first, first + rows) of m into tile a. The scales' start must
// be 16-byte aligned: first·groups a multiple of 8.
template <WFormat F>
__device__ void copy_rows_async(const AsyncTile<F>& a, const ChunkMatrix<F>& m, int64_t first, int rows) {
  copy_async(a.w, m.w + first * m.chunks, rows * m.chunks * 16);
  if constexpr (F != WFormat::BF16) {
    copy_async(a.scales, m.scales + first * m.groups, rows * m.groups * 2);
    copy_async(a.biases, m.biases + first * m.groups, rows * m.groups * 2);
  }
}

// ---- Hopper bulk copies (TMA): a thread moves whole contiguous ranges with single instructions;
// an mbarrier counts the issuing threads' arrivals and the bytes landed. Device code for sm_90 and
// later only (callers keep cp.async below that). ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}
// After mbar_init, before any other thread or the copy engine uses the barrier (then a block barrier).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival, and `bytes` more to land before the barrier's phase completes.
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Waits for the barrier's phase of parity `parity` to complete.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// `bytes` (a multiple of 16; both ends 16-byte aligned) global -> shared, counted on bar.
__device__ __forceinline__ void bulk_copy(const void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// One thread: rows [first, first + rows) of m into tile a by bulk copies counted on bar, as one
// arrival. A scale run that does not end on 16 bytes (a matrix's last rows) has its last values
// copied by plain loads, visible after the block's next barrier.
template <WFormat F>
__device__ void bulk_rows(const AsyncTile<F>& a, const ChunkMatrix<F>& m, int64_t first, int rows, uint64_t* bar) {
  const uint32_t w_bytes = uint32_t(rows) * m.chunks * 16;
  uint32_t s_bytes = 0, s_all = 0;
  if constexpr (F != WFormat::BF16) {
    s_all = uint32_t(rows) * m.groups * 2;
    s_bytes = s_all & ~15u;
  }
  mbar_arrive_expect(bar, w_bytes + 2 * s_bytes);
  bulk_copy(a.w, m.w + first * m.chunks, w_bytes, bar);
  if constexpr (F != WFormat::BF16) {
    const int64_t s0 = first * m.groups;
    if (s_bytes > 0) {
      bulk_copy(a.scales, m.scales + s0, s_bytes, bar);
      bulk_copy(a.biases, m.biases + s0, s_bytes, bar);
    }
    for (uint32_t i = s_bytes / 2; i < s_all / 2; ++i) {
      const_cast<bf16*>(a.scales)[i] = m.scales[s0 + i];
      const_cast<bf16*>(a.biases)[i] = m.biases[s0 + i];
    }
  }
}

// Most chunks a lane holds of a register-held activation row: 16 words a chunk (4-bit, FP8) or 8.
__host__ __device__ constexpr int max_lane_chunks(WFormat f) { return f == WFormat::Q4 || f == WFormat::F8 ? 4 : 8; }

// Chunks per lane where one activation row of `chunks` chunks is held in registers (chunks lane +
// 32j, at most 72 registers of them), else 0.
inline int lane_x_chunks(WFormat f, int chunks) {
  if (chunks % 32) return 0;
  const int cpl = chunks / 32, max_cpl = max_lane_chunks(f);
  return cpl <= max_cpl && (cpl == 1 || cpl == 2 || cpl == 4 || cpl == 8) ? cpl : 0;
}

// This lane's chunks (lane + 32j) of staged activation row 0, into registers.
template <WFormat F, int CPL>
__device__ __forceinline__ void load_lane_x(const Staged<F>& st, ChunkX<F> (&xr)[CPL]) {
#pragma unroll
  for (int j = 0; j < CPL; ++j) xr[j] = st.load_x(0, threadIdx.x % 32 + 32 * j);
}

// This lane's part of row `row` of tile a dotted with the activations in xr (a warp_sum away
// from the whole dot product).
template <WFormat F, int CPL>
__device__ __forceinline__ float row_dot_x1(const AsyncTile<F>& a, const ChunkMatrix<F>& m, int row,
                                            const ChunkX<F> (&xr)[CPL]) {
  const int lane = threadIdx.x % 32;
  const uint4* w = a.w + row * m.chunks + lane;
  float acc = 0.0f;
  if constexpr (F == WFormat::BF16) {
#pragma unroll
    for (int j = 0; j < CPL; ++j) acc += dot_x<F>(Chunk{w[32 * j], 0.0f, 0.0f}, xr[j]);
  } else {
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      const int g = row * m.groups + ((lane + 32 * j) >> m.group_shift);
      acc += dot_x<F>(Chunk{w[32 * j], __bfloat162float(a.scales[g]), __bfloat162float(a.biases[g])}, xr[j]);
    }
  }
  return acc;
}


// ---- Dot products of weights in shared memory with one activation row in registers: a block of
// kAsyncWarps warps (the one-token async GEMV) ----
constexpr int kAsyncWarps = 16;

// Rows [0, rows) of tile a dotted with one activation row held in registers (xr, scaled by
// `scale`): a warp per row, two rows at a time. Where keep is set, row r's stored value also goes
// to keep[r]. Without `store` nothing is written (a pass that only runs the code).
template <WFormat F, int CPL>
__device__ void tile_rows_x1(const AsyncTile<F>& a, const ChunkMatrix<F>& m, int rows, const ChunkX<F> (&xr)[CPL],
                             float scale, const GemvOut& out, int first, float* keep, bool store = true) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int row = warp; row < rows; row += 2 * kAsyncWarps) {  // uniform per warp: shuffles are safe
    const int row2 = row + kAsyncWarps;
    const float v = warp_sum(row_dot_x1(a, m, row, xr)), v2 = row2 < rows ? warp_sum(row_dot_x1(a, m, row2, xr)) : 0.0f;
    if (!store) continue;
    if (lane == 0) {
      const float stored = write_out(out, first + row, v * scale);
      if (keep) keep[row] = stored;
    }
    if (lane == 0 && row2 < rows) {
      const float stored = write_out(out, first + row2, v2 * scale);
      if (keep) keep[row2] = stored;
    }
  }
}

// Rows [0, rows) of tile a (its first a_rows) and then tile b dotted with one activation row held
// in registers, scaled by `scale`: a warp four rows at a time, their sums reduced together
// (warp_sum4: 1.4x tile_rows_x1's rate in a micro-benchmark, the same values bit for bit). keep and
// store as in tile_rows_x1.
template <WFormat F, int CPL>
__device__ void tile_pair_rows_x1(const AsyncTile<F>& a, const AsyncTile<F>& b, int a_rows, const ChunkMatrix<F>& m,
                                  int rows, const ChunkX<F> (&xr)[CPL], float scale, const GemvOut& out, int first,
                                  float* keep, bool store = true) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int mine = ((lane >> 4) & 1) * 2 + ((lane >> 3) & 1);  // of the four rows, the one this lane ends with
  for (int base = warp; base < rows; base += 4 * kAsyncWarps) {  // uniform per warp: shuffles are safe
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = base + kAsyncWarps * i;
      v[i] = row >= rows ? 0.0f : row < a_rows ? row_dot_x1(a, m, row, xr) : row_dot_x1(b, m, row - a_rows, xr);
    }
    const float total = warp_sum4(v);
    const int row = base + kAsyncWarps * mine;
    if (store && lane % 8 == 0 && row < rows) {
      const float stored = write_out(out, first + row, total * scale);
      if (keep) keep[row] = stored;
    }
  }
}

// Whole block, once its `rows` rows of h are in keep and their rows of route.cols in `cols`: adds
// Σ_r cols[r][e]·keep[r] to route.sums[e] in fixed point.
__device__ inline void add_route_sums(const RouteSums& route, const bf16* cols, const float* keep, int rows) {
  for (int e = threadIdx.x; e < route.n; e += blockDim.x) {
    float acc = 0.0f;
    for (int r = 0; r < rows; ++r) acc += __bfloat162float(cols[r * route.ld + e]) * keep[r];
    atomicAdd(route.sums + e, static_cast<unsigned long long>(__float2ll_rn(acc * kRouteFixedOne)));
  }
}

// Whole block, once the values it stored for its `rows` rows from row r0 on are in keep: its best
// (value, row) to cand, `none` where every value is NaN (as argmax's first stage finds it).
__device__ inline void leave_argmax_candidate(const ArgmaxCandidates& cand, const float* keep, int r0, int rows,
                                              int none) {
  float v = -INFINITY;
  int idx = none;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) keep_better(v, idx, keep[r], r0 + r);
  block_argmax(v, idx);
  if (threadIdx.x == 0) {
    cand.v[blockIdx.x] = v;
    cand.i[blockIdx.x] = idx;
  }
}

// Rows [0, rows) of the gate and up tiles gt, ut dotted with one activation row in registers (xr,
// scaled by `scale`) by a block of WARPS warps: act[row] = silu(gate·x)·(up·x). A warp takes rows row and row + 16, gate and
// up, their four sums reduced together (warp_sum4: tile_pair_rows_x1's faster form, the same values bit
// for bit): lanes 0 and 16 end with a row's gate sum, lanes 8 and 24 with its up sum.
template <WFormat F, int CPL, int WARPS>
__device__ __forceinline__ void gate_up_rows(const AsyncTile<F>& gt, const AsyncTile<F>& ut, const ChunkMatrix<F>& gm,
                                             const ChunkMatrix<F>& um, int rows, const ChunkX<F> (&xr)[CPL],
                                             float scale, float* act) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int row = warp; row < rows; row += 2 * WARPS) {  // uniform per warp: shuffles are safe
    const int row2 = row + WARPS;
    const bool two = row2 < rows;
    const float v[4] = {row_dot_x1(gt, gm, row, xr), row_dot_x1(ut, um, row, xr),
                        two ? row_dot_x1(gt, gm, row2, xr) : 0.0f, two ? row_dot_x1(ut, um, row2, xr) : 0.0f};
    const float total = warp_sum4(v), u = __shfl_down_sync(0xffffffffu, total, 8);
    const int mine = lane == 0 ? row : lane == 16 && two ? row2 : -1;
    if (mine >= 0) act[mine] = siluf_(total * scale) * (u * scale);
  }
}

// Whole block, its gate and up rows copied by cp.async (still landing) and its activation row
// staged in st: waits for every copy, then gate_up_rows with the row's lane chunks in registers.
template <WFormat F, int CPL, int WARPS>
__device__ __forceinline__ void gate_up_rows_once_landed(const Staged<F>& st, const AsyncTile<F>& gt,
                                                         const AsyncTile<F>& ut, const ChunkMatrix<F>& gm,
                                                         const ChunkMatrix<F>& um, int rows, float* act) {
  ChunkX<F> xr[CPL];
  load_lane_x(st, xr);
  const float scale = st.row_scale(0);
  cp_async_wait<0>();
  __syncthreads();  // every thread's copies have landed
  gate_up_rows<F, CPL, WARPS>(gt, ut, gm, um, rows, xr, scale, act);
}

// ---- The one-token down projection's dots: n staged activation rows (the experts' and the shared
// expert's act rows), row j meeting the `per`-row tile of its own matrix in shared memory ----

// A lane's (row j, chunk c) pairs p = lane + 32i: their activations, routing weights mix[j] and the
// byte offsets of their chunk and scale in row 0 of tile j (which starts tile_at(j) bytes in).
template <WFormat F, int PPL>
struct DownPairs {
  ChunkX<F> xr[PPL];
  float mr[PPL];
  int w_at[PPL], s_at[PPL];
};
template <WFormat F, int PPL, typename TileAt>
__device__ __forceinline__ DownPairs<F, PPL> down_pairs(const Staged<F>& st, const ChunkMatrix<F>& dm, int n, int per,
                                                        const float* mix, TileAt tile_at) {
  const int lane = threadIdx.x % 32, scales_at = per * dm.chunks * 16;
  DownPairs<F, PPL> d;
#pragma unroll
  for (int i = 0; i < PPL; ++i) {  // pair p = lane + 32i is (row j = p / chunks, chunk c = p % chunks)
    const int p = lane + 32 * i, j = p / dm.chunks, c = p % dm.chunks, at = tile_at(min(j, n - 1));
    d.mr[i] = 0.0f;
    d.w_at[i] = at + c * 16;
    d.s_at[i] = at + scales_at + (c >> dm.group_shift) * 2;
    if (j < n) {
      d.xr[i] = st.load_x(j, c);
      d.mr[i] = mix[j];
    }
  }
  return d;
}

// Whole block of WARPS warps, once every tile has landed: out[r0 + row] = Σ over the pairs of mr ·
// (tile row · activations) for rows [0, rows), a warp per row.
template <WFormat F, int PPL, int WARPS>
__device__ __forceinline__ void down_rows(const char* smem, const DownPairs<F, PPL>& d, const ChunkMatrix<F>& dm,
                                          int n, int per, int rows, const GemvOut& out, int r0) {
  const int lane = threadIdx.x % 32, biases_from_scales = per * dm.groups * 2;
  for (int row = threadIdx.x / 32; row < rows; row += WARPS) {
    const int row_w = row * dm.chunks * 16, row_s = row * dm.groups * 2;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < PPL; ++i) {
      if (lane + 32 * i >= n * dm.chunks) continue;
      Chunk ch;
      ch.raw = *reinterpret_cast<const uint4*>(smem + d.w_at[i] + row_w);
      if constexpr (F != WFormat::BF16) {
        const char* sp = smem + d.s_at[i] + row_s;
        ch.scale = __bfloat162float(*reinterpret_cast<const bf16*>(sp));
        ch.bias = __bfloat162float(*reinterpret_cast<const bf16*>(sp + biases_from_scales));
      }
      acc += d.mr[i] * dot_x<F>(ch, d.xr[i]);
    }
    acc = warp_sum(acc);
    if (lane == 0) write_out(out, r0 + row, acc);
  }
}

}  // namespace petrel::cuda
