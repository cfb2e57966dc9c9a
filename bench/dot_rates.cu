// How fast a block dots 4-bit weight rows that are already in shared memory with one staged
// activation row: the phase that follows a one-token GEMV's wait once its copies have landed
// (stamps put it at ~0.9 us per 32-row tile inside the input projections, about half the rate of
// the integer pipe the dots are bound by). Each block (one per multiprocessor,
// 512 threads, as the decode GEMV) holds 128 rows x 2048 columns of 4-bit weights (MLX affine,
// groups of 64) as four 32-row tiles of the GEMV ring, stages a random activation row with the
// product's stage_rows (two int8 levels a chunk), and dots all 128 rows kReps times per variant:
//  - kernel:     as gemv_async_kernel's tile_rows_x1 — a warp two rows at a time, a five-step
//                shuffle sum per row, a block barrier before and after each tile;
//  - one-sync:   the same without the barrier after each tile (a ring that never refills a slot);
//  - four-rows:  a warp four rows at a time over 64-row passes, their sums reduced together
//                (warp_sum4: 7 shuffles for four rows instead of 20; what linear.cu's
//                tile_pair_rows_x1 does);
//  - one-level:  as kernel with the activations' first int8 level only (half the dp4a): what the
//                second level costs, and the error it removes (printed against kernel's values);
//  - mma:        the same rows on the tensor cores (mma m16n8k32, 4-bit codes as u8 times the
//                activations' int8 levels), in its own layout (mma_kernel below): what a one-token
//                GEMV's dots could cost there (dots twice as fast would be worth ~5% of decode;
//                measured 418 ns against four-rows' 462, 1.1x, so not worth the new layouts).
// Prints the median over blocks of ns per 32-row tile, each variant's largest deviation from
// kernel's outputs, and kernel's and mma's largest error against an exact (fp64) product. Built with the CUDA backend (bench/CMakeLists.txt); on the GPU machine, after
// scripts/gpu-build.sh: ./build-gpu/bench/dot_rates.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/gemv.cuh"
#include "cuda_check.h"

using namespace petrel::cuda;

constexpr int kThreads = 512, kWarps = kThreads / 32, kRows = 128, kTileRows = 32, kCols = 2048, kGroup = 64;
constexpr int kChunks = kCols / 32, kGroups = kCols / kGroup, kTiles = kRows / kTileRows, kReps = 64;
constexpr int kCpl = kChunks / 32;  // chunks a lane holds of the activation row
constexpr int kSlotBytes = kTileRows * (kChunks * 16 + 4 * kGroups);
enum Variant { kKernel, kOneSync, kFourRows, kOneLevel };
constexpr int kQuads = kGroups / 4;  // groups of 4 quantisation groups: an mma's k slots (see mma_kernel)

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Σ q·x1 over 32 4-bit codes and the first int8 level only (x[0..1] of ChunkX), times 127 so that
// it scales as dot_q4_int8x2.
__device__ __forceinline__ int dot_q4_int8x1(const uint4& raw, const uint4 (&x)[4]) {
  const uint32_t hi[8] = {x[0].x, x[0].y, x[0].z, x[0].w, x[1].x, x[1].y, x[1].z, x[1].w};
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  int even = 0, odd16 = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    even = __dp4a(int(words[i] & 0x0F0F0F0Fu), int(hi[2 * i]), even);
    asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(odd16) : "r"(words[i] & 0xF0F0F0F0u), "r"(hi[2 * i + 1]));
  }
  return 127 * (even + (odd16 >> 4));
}

// This lane's part of row `row` of tile a with the activations in xr (row_dot_x1), or with their
// first level only.
template <Variant V>
__device__ __forceinline__ float lane_dot(const AsyncTile<WFormat::Q4>& a, const ChunkMatrix<WFormat::Q4>& m, int row,
                                          const ChunkX<WFormat::Q4> (&xr)[kCpl]) {
  if constexpr (V != kOneLevel) {
    return row_dot_x1(a, m, row, xr);
  } else {
    const int lane = threadIdx.x % 32;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kCpl; ++j) {
      const int c = lane + 32 * j, g = row * m.groups + (c >> m.group_shift);
      const int q = dot_q4_int8x1(a.w[row * m.chunks + c], xr[j].x);
      acc += __bfloat162float(a.scales[g]) * xr[j].level_scale * float(q) + __bfloat162float(a.biases[g]) * xr[j].sum;
    }
    return acc;
  }
}

// One block a multiprocessor: the tiles and the activation row into shared memory, then kReps
// passes of variant V over all rows; stamps[block] = ns for the passes, out = the last pass's rows.
template <Variant V>
__global__ void __launch_bounds__(kThreads, 1)
    dot_kernel(const uint4* tiles, const float* x, float* out, uint64_t* stamps) {
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  for (int i = threadIdx.x; i < kTiles * kSlotBytes / 16; i += kThreads) reinterpret_cast<uint4*>(smem)[i] = tiles[i];
  DeviceMatrix dm;
  dm.format = WFormat::Q4;
  dm.rows = kRows;
  dm.cols = kCols;
  dm.group = kGroup;
  const ChunkMatrix<WFormat::Q4> m = chunk_matrix<WFormat::Q4>(dm);
  const Staged<WFormat::Q4> st = stage_rows<WFormat::Q4>(reinterpret_cast<float*>(smem + kTiles * kSlotBytes), x, 4,
                                                         kCols, 1, [](int) { return int64_t(0); });
  ChunkX<WFormat::Q4> xr[kCpl];
  load_lane_x(st, xr);
  auto tile = [&](int t) { return AsyncTile<WFormat::Q4>::at(smem + t * kSlotBytes, kTileRows, m); };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  const uint64_t start = now_ns();
  for (int rep = 0; rep < kReps; ++rep) {
    if constexpr (V == kFourRows) {
      for (int pass = 0; pass < kRows; pass += 4 * kWarps) {
        __syncthreads();
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = pass + warp + kWarps * i;
          v[i] = lane_dot<V>(tile(row / kTileRows), m, row % kTileRows, xr);
        }
        const float total = warp_sum4(v);
        const int row = pass + warp + kWarps * (((lane >> 4) & 1) * 2 + ((lane >> 3) & 1));
        if (lane % 8 == 0) out[blockIdx.x * kRows + row] = total;
      }
    } else {
      for (int t = 0; t < kTiles; ++t) {
        __syncthreads();
        for (int row = warp; row < kTileRows; row += 2 * kWarps) {
          const int row2 = row + kWarps;
          const float v = warp_sum(lane_dot<V>(tile(t), m, row, xr)), v2 = warp_sum(lane_dot<V>(tile(t), m, row2, xr));
          if (lane == 0) {
            out[blockIdx.x * kRows + t * kTileRows + row] = v;
            out[blockIdx.x * kRows + t * kTileRows + row2] = v2;
          }
        }
        if constexpr (V != kOneSync) __syncthreads();
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) stamps[blockIdx.x] = now_ns() - start;
}


// ---- mma: the dots on the tensor cores ----
// An m16n8k32 mma multiplies 16 rows by 32 k slots. Thread t of each lane quad (lane % 4) holds k
// slots 4t..4t+3 and 16+4t..16+4t+3 of its rows; here those 8 slots carry 8 weights of group
// 4Q + t, so one mma covers 16 rows x 4 groups x 8 weights. B is block diagonal: column n (two a
// group, its int8 levels x1 and x2) is non-zero only in the slots of thread n / 2, so lane t of
// each quad ends with group 4Q + t's two level sums in its accumulators, and all 32 lanes share
// the scale-and-bias epilogue (a plain layout would leave it to 8 lanes). A weight word (8 codes)
// gives the even codes (word & 0x0F0F0F0F, an mma of their own) and the odd ones times 16 (word &
// 0xF0F0F0F0, another mma, its sum shifted back exactly). Activations take one int8 scale per
// quantisation group (64 values), not per 32, so that a group's sums stay integers. Only the 8
// non-zero lanes of each B fragment are stored and read (the rest load nothing), and each k step
// has its own sums, so a quad's 8 mmas do not wait on each other (497 -> 418 ns a tile).
constexpr int kRowPitch = kChunks * 16 + 16;  // bytes: 16 B of padding keep the quads' loads off one bank
constexpr int kMmaWarpsPerTile = kWarps / (kRows / 16);  // warps sharing one 16-row tile (each a range of quads)
constexpr int kQuadsPerWarp = kQuads / kMmaWarpsPerTile;
struct MmaSmem {
  uint8_t w[kRows][kRowPitch];
  uint16_t scales[kRows][kGroups], biases[kRows][kGroups];
  uint4 b[kQuads][4][8];  // non-zero B fragments by (quad, k step, column n: lane 4n + n / 2): even b0, b1, odd b0, b1
  float level_scale[kGroups], sum[kGroups];
  float part[kMmaWarpsPerTile][kRows];
};

__device__ __forceinline__ void mma_u8s8(int d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Whole block, untimed: the tiles' rows at pitch P (w), their scales and biases, and x as two
// int8 levels per 64-value group (d = max|x|/127 per group, x1 = round(x/d), x2 = round(127·(x/d −
// x1)), as stage_rows does per chunk) with each group's level scale d/127² and Σx.
template <int P>
__device__ void stage_for_mma(uint8_t (*w)[P], uint16_t (*scales)[kGroups], uint16_t (*biases)[kGroups],
                              float* level_scale, float* group_sum, int8_t (*levels)[kCols], const uint4* tiles,
                              const float* x) {
  const char* src = reinterpret_cast<const char*>(tiles);
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks, t = r / kTileRows, tr = r % kTileRows;
    *reinterpret_cast<uint4*>(&w[r][c * 16]) =
        *reinterpret_cast<const uint4*>(src + size_t(t) * kSlotBytes + (tr * kChunks + c) * 16);
  }
  for (int i = threadIdx.x; i < kRows * kGroups; i += kThreads) {
    const int r = i / kGroups, g = i % kGroups, t = r / kTileRows, tr = r % kTileRows;
    const uint16_t* sb = reinterpret_cast<const uint16_t*>(src + size_t(t) * kSlotBytes + kTileRows * kChunks * 16);
    scales[r][g] = sb[tr * kGroups + g];
    biases[r][g] = sb[kTileRows * kGroups + tr * kGroups + g];
  }
  for (int g = threadIdx.x; g < kGroups; g += kThreads) {
    float mx = 0.0f, sum = 0.0f;
    for (int i = 0; i < kGroup; ++i) {
      mx = fmaxf(mx, fabsf(x[g * kGroup + i]));
      sum += x[g * kGroup + i];
    }
    const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
    for (int i = 0; i < kGroup; ++i) {
      const float t = x[g * kGroup + i] * inv, x1 = rintf(t);
      levels[0][g * kGroup + i] = int8_t(x1);
      levels[1][g * kGroup + i] = int8_t(__float2int_rn((t - x1) * 127.0f));
    }
    level_scale[g] = mx / (127.0f * 127.0f);
    group_sum[g] = sum;
  }
  __syncthreads();
}

// Whole block, untimed: stage_for_mma, then x's levels as B fragments in the mma layout.
__device__ void mma_stage(MmaSmem& sm, const uint4* tiles, const float* x) {
  __shared__ int8_t levels[2][kCols];
  stage_for_mma<kRowPitch>(sm.w, sm.scales, sm.biases, sm.level_scale, sm.sum, levels, tiles, x);
  // Lane (n = lane / 4, t = lane % 4) holds column n's slots of thread t: non-zero where t = n / 2
  // (group 4Q + t, level n % 2). At k step s thread t's slots hold words 2s (slots 4t..) and 2s + 1
  // (slots 16 + 4t..) of its group: codes 16s + 2i (+ 8 for the second word), + 1 for the odd ones.
  // Only those 8 lanes' fragments are stored (the rest are zeros): a quarter of the shared-memory reads.
  for (int i = threadIdx.x; i < kQuads * 4 * 8; i += kThreads) {
    const int q = i / 32, s = i / 8 % 4, n = i % 8, t = n / 2;
    uint32_t v[4] = {};
    const int8_t* lv = levels[n % 2] + (4 * q + t) * kGroup + 16 * s;
    for (int k = 0; k < 4; ++k)
      for (int b = 0; b < 4; ++b) {
        const int code = (k % 2) * 8 + 2 * b + k / 2;  // k: even codes of word 2s, of 2s + 1, odd codes of each
        v[k] |= uint32_t(uint8_t(lv[code])) << (8 * b);
      }
    sm.b[q][s][n] = make_uint4(v[0], v[1], v[2], v[3]);
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1) mma_kernel(const uint4* tiles, const float* x, float* out, uint64_t* stamps) {
  extern __shared__ float4 smem4[];
  MmaSmem& sm = *reinterpret_cast<MmaSmem*>(smem4);
  mma_stage(sm, tiles, x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row0 = 16 * (warp % (kRows / 16)), part = warp / (kRows / 16), q0 = part * kQuadsPerWarp;
  const uint64_t start = now_ns();
  for (int rep = 0; rep < kReps; ++rep) {
    float acc[2] = {};  // rows row0 + g and row0 + g + 8, this lane's groups
#pragma unroll
    for (int q = q0; q < q0 + kQuadsPerWarp; ++q) {
      const int group = 4 * q + t;
      uint4 w[2][2];  // [row g, g + 8][words 0-3, 4-7] of this lane's group
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* p = &sm.w[row0 + g + 8 * h][group * 32];
        w[h][0] = *reinterpret_cast<const uint4*>(p);
        w[h][1] = *reinterpret_cast<const uint4*>(p + 16);
      }
      // A sum of their own for each k step: the four mmas of a kind are independent, not a chain.
      int even[4][4] = {}, odd16[4][4] = {};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t w0 = s < 2 ? (s == 0 ? w[0][0].x : w[0][0].z) : (s == 2 ? w[0][1].x : w[0][1].z);
        const uint32_t w1 = s < 2 ? (s == 0 ? w[0][0].y : w[0][0].w) : (s == 2 ? w[0][1].y : w[0][1].w);
        const uint32_t v0 = s < 2 ? (s == 0 ? w[1][0].x : w[1][0].z) : (s == 2 ? w[1][1].x : w[1][1].z);
        const uint32_t v1 = s < 2 ? (s == 0 ? w[1][0].y : w[1][0].w) : (s == 2 ? w[1][1].y : w[1][1].w);
        const uint4 b = t == g / 2 ? sm.b[q][s][g] : make_uint4(0, 0, 0, 0);
        const uint32_t lo[4] = {w0 & 0x0F0F0F0Fu, v0 & 0x0F0F0F0Fu, w1 & 0x0F0F0F0Fu, v1 & 0x0F0F0F0Fu};
        const uint32_t hi[4] = {w0 & 0xF0F0F0F0u, v0 & 0xF0F0F0F0u, w1 & 0xF0F0F0F0u, v1 & 0xF0F0F0F0u};
        mma_u8s8(even[s], lo, b.x, b.y);
        mma_u8s8(odd16[s], hi, b.z, b.w);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // accumulators 2h, 2h + 1: row g + 8h, levels x1, x2
        const int r = row0 + g + 8 * h;
        int e1 = 0, o1 = 0, e2 = 0, o2 = 0;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          e1 += even[s][2 * h];
          o1 += odd16[s][2 * h];
          e2 += even[s][2 * h + 1];
          o2 += odd16[s][2 * h + 1];
        }
        const int sum = 127 * (e1 + (o1 >> 4)) + e2 + (o2 >> 4);
        const float sc = __bfloat162float(__ushort_as_bfloat16(sm.scales[r][group]));
        const float bi = __bfloat162float(__ushort_as_bfloat16(sm.biases[r][group]));
        acc[h] += sc * sm.level_scale[group] * float(sum) + bi * sm.sum[group];
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 1);
      acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 2);
      if (t == 0) sm.part[part][row0 + g + 8 * h] = acc[h];
    }
    __syncthreads();
    if (threadIdx.x < kRows) {
      float v = 0.0f;
      for (int i = 0; i < kMmaWarpsPerTile; ++i) v += sm.part[i][threadIdx.x];
      out[blockIdx.x * kRows + threadIdx.x] = v;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) stamps[blockIdx.x] = now_ns() - start;
}

// ---- mma2: the tensor-core form a decode GEMV could take ----
// As mma (the block-diagonal B: lane t of each quad owns group 4Q + t's k slots), with three
// changes that cut the integer work a weight from ~0.55 to ~0.28 instructions:
//  - a warp keeps one quad of columns (256) for every tile, so its B fragments (x's two int8
//    levels, per 64-value group) live in 16 registers, loaded once;
//  - one mask a weight word, not two: the raw word (even code + 16 x odd code a byte) meets the
//    odd activations, the masked word both the odd and the even ones, and
//    raw·x_odd - even·x_odd = 16·Σ odd·x_odd exactly (three mmas a k step, one LOP a word);
//  - the tiles keep the ring's row layout (rows of 1024 bytes), or a padded pitch (P) so that
//    the 8 rows a load instruction reads fall on distinct banks.
// The 16 warps split a 32-row tile as 2 row blocks x 8 quads; each quad's row sums meet in
// shared memory once all tiles are done (one barrier a pass); TILE_SYNC adds a barrier after each
// tile, as a ring that waits for each tile's copies would.
template <int P>
struct Mma2Smem {
  uint8_t w[kRows][P];
  uint16_t scales[kRows][kGroups], biases[kRows][kGroups];
  uint4 b[kQuads][4][8];  // (quad, k step, lane g of t = g / 2): even b0, b1, odd b0, b1
  float level_scale[kGroups], sum[kGroups];
  float part[kQuads][kRows];
};

// Whole block, untimed: rows at pitch P, x as per-group levels in mma2's B fragments.
template <int P>
__device__ void mma2_stage(Mma2Smem<P>& sm, const uint4* tiles, const float* x) {
  __shared__ int8_t levels[2][kCols];
  stage_for_mma<P>(sm.w, sm.scales, sm.biases, sm.level_scale, sm.sum, levels, tiles, x);
  // Lane g of t = g / 2 holds level g % 2 of group 4q + t. At k step s its slots meet words 2s
  // (b0) and 2s + 1 (b1) of the group's row bytes: byte j of word w holds codes 8w + 2j (low
  // nibble) and 8w + 2j + 1 (high).
  for (int i = threadIdx.x; i < kQuads * 4 * 8; i += kThreads) {
    const int q = i / 32, s = i / 8 % 4, g = i % 8, t = g / 2;
    const int8_t* lv = levels[g % 2] + (4 * q + t) * kGroup;
    uint32_t v[4] = {};
    for (int k = 0; k < 4; ++k)  // even b0, even b1, odd b0, odd b1
      for (int j = 0; j < 4; ++j) {
        const int code = 8 * (2 * s + k % 2) + 2 * j + k / 2;
        v[k] |= uint32_t(uint8_t(lv[code])) << (8 * j);
      }
    sm.b[q][s][g] = make_uint4(v[0], v[1], v[2], v[3]);
  }
  __syncthreads();
}

enum Mma2Form { kRawTrick, kTwoMasks, kOneMma };
template <int P, bool TILE_SYNC, Mma2Form FORM = kRawTrick>
__global__ void __launch_bounds__(kThreads, 1) mma2_kernel(const uint4* tiles, const float* x, float* out, uint64_t* stamps) {
  extern __shared__ float4 smem4[];
  Mma2Smem<P>& sm = *reinterpret_cast<Mma2Smem<P>*>(smem4);
  mma2_stage(sm, tiles, x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rb = warp / kQuads, q = warp % kQuads, group = 4 * q + t;
  uint4 b[4];  // this lane's B fragments for its quad, every k step
#pragma unroll
  for (int s = 0; s < 4; ++s) b[s] = t == g / 2 ? sm.b[q][s][g] : make_uint4(0, 0, 0, 0);
  const float ls = sm.level_scale[group], xsum = sm.sum[group];
  const uint64_t start = now_ns();
  for (int rep = 0; rep < kReps; ++rep) {
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
      const int r0 = tile * kTileRows + 16 * rb + g;  // rows r0 and r0 + 8
      uint4 w[2][2];                                    // [row r0, r0 + 8][words 0-3, 4-7] of the group
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* p = &sm.w[r0 + 8 * h][group * 32];
        w[h][0] = *reinterpret_cast<const uint4*>(p);
        w[h][1] = *reinterpret_cast<const uint4*>(p + 16);
      }
      int raw_odd[4] = {}, even_odd[4] = {}, even_even[4] = {};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint4& u = w[0][s / 2];
        const uint4& v = w[1][s / 2];
        const uint32_t raw[4] = {s % 2 ? u.z : u.x, s % 2 ? v.z : v.x, s % 2 ? u.w : u.y, s % 2 ? v.w : v.y};
        const uint32_t even[4] = {raw[0] & 0x0F0F0F0Fu, raw[1] & 0x0F0F0F0Fu, raw[2] & 0x0F0F0F0Fu,
                                  raw[3] & 0x0F0F0F0Fu};
        if constexpr (FORM == kRawTrick) {
          mma_u8s8(raw_odd, raw, b[s].z, b[s].w);
          mma_u8s8(even_odd, even, b[s].z, b[s].w);
        } else if constexpr (FORM == kTwoMasks) {  // raw_odd holds 16·Σ odd·x_odd itself
          const uint32_t odd16[4] = {raw[0] & 0xF0F0F0F0u, raw[1] & 0xF0F0F0F0u, raw[2] & 0xF0F0F0F0u,
                                     raw[3] & 0xF0F0F0F0u};
          mma_u8s8(raw_odd, odd16, b[s].z, b[s].w);
        }
        mma_u8s8(even_even, even, b[s].x, b[s].y);
      }
      float acc[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // accumulators 2h, 2h + 1: row r0 + 8h, levels x1, x2
        const int l1 = even_even[2 * h] + ((raw_odd[2 * h] - even_odd[2 * h]) >> 4);
        const int l2 = even_even[2 * h + 1] + ((raw_odd[2 * h + 1] - even_odd[2 * h + 1]) >> 4);
        const int r = r0 + 8 * h;
        const float sc = __bfloat162float(__ushort_as_bfloat16(sm.scales[r][group]));
        const float bi = __bfloat162float(__ushort_as_bfloat16(sm.biases[r][group]));
        acc[h] = sc * (ls * float(127 * l1 + l2)) + bi * xsum;
        acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 1);
        acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 2);
      }
      if (t == 0) {
        sm.part[q][r0] = acc[0];
        sm.part[q][r0 + 8] = acc[1];
      }
      if constexpr (TILE_SYNC) __syncthreads();  // a tile at a time, as its copies land in a GEMV ring
    }
    __syncthreads();
    if (threadIdx.x < kRows) {
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < kQuads; ++i) v += sm.part[i][threadIdx.x];
      out[blockIdx.x * kRows + threadIdx.x] = v;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) stamps[blockIdx.x] = now_ns() - start;
}

using DotKernel = void (*)(const uint4*, const float*, float*, uint64_t*);

// Median over 5 launches (after a warm-up) of the median block's ns a 32-row tile.
float tile_ns(DotKernel kernel, int sms, const uint4* tiles, const float* x, float* out, uint64_t* stamps, size_t smem) {
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  std::vector<float> medians;
  for (int launch = 0; launch < 6; ++launch) {  // the first warms up
    kernel<<<sms, kThreads, smem>>>(tiles, x, out, stamps);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<uint64_t> ns(sms);
    CHECK(cudaMemcpy(ns.data(), stamps, ns.size() * 8, cudaMemcpyDeviceToHost));
    std::sort(ns.begin(), ns.end());
    if (launch > 0) medians.push_back(float(ns[ns.size() / 2]) / (kReps * kTiles));
  }
  std::sort(medians.begin(), medians.end());
  return medians[medians.size() / 2];
}

template <Variant V>
float run(int sms, const uint4* tiles, const float* x, float* out, uint64_t* stamps, size_t smem) {
  return tile_ns(dot_kernel<V>, sms, tiles, x, out, stamps, smem);
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint32_t seed = 2024;
  auto next = [&] { return seed = seed * 1664525u + 1013904223u; };
  auto uniform = [&](float lo, float hi) { return lo + (hi - lo) * float(next() >> 8) / 16777216.0f; };
  auto to_bf16 = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  };
  // Four tiles in the ring's layout: each tile's weights (rows x chunks x 16 bytes), then its
  // scales and biases (rows x groups bf16 each).
  std::vector<uint8_t> host(size_t(kTiles) * kSlotBytes);
  for (int t = 0; t < kTiles; ++t) {
    uint8_t* p = host.data() + size_t(t) * kSlotBytes;
    for (int i = 0; i < kTileRows * kChunks * 16; i += 4) {
      const uint32_t w = next();
      std::memcpy(p + i, &w, 4);
    }
    uint16_t* scales = reinterpret_cast<uint16_t*>(p + kTileRows * kChunks * 16);
    for (int i = 0; i < kTileRows * kGroups; ++i) {
      scales[i] = to_bf16(uniform(0.002f, 0.01f));
      scales[kTileRows * kGroups + i] = to_bf16(uniform(-0.05f, -0.01f));
    }
  }
  std::vector<float> hx(kCols);
  for (float& v : hx) v = uniform(-1.0f, 1.0f) * (next() % 16 == 0 ? 8.0f : 1.0f);  // a few outliers, as activations have
  uint4* tiles = nullptr;
  float *x = nullptr, *out = nullptr;
  uint64_t* stamps = nullptr;
  CHECK(cudaMalloc(&tiles, host.size()));
  CHECK(cudaMalloc(&x, kCols * sizeof(float)));
  CHECK(cudaMalloc(&out, size_t(sms) * kRows * sizeof(float)));
  CHECK(cudaMalloc(&stamps, sms * sizeof(uint64_t)));
  CHECK(cudaMemcpy(tiles, host.data(), host.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(x, hx.data(), kCols * sizeof(float), cudaMemcpyHostToDevice));
  const size_t smem = size_t(kTiles) * kSlotBytes + staged_bytes(WFormat::Q4, kCols, 1);

  auto rows_of = [&] {
    std::vector<float> v(size_t(sms) * kRows);
    CHECK(cudaMemcpy(v.data(), out, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  };
  std::printf("dot rates: %d blocks of %d threads, %d rows x %d 4-bit columns each (%d tiles of %d rows), %d passes; "
              "median over blocks and of 5 launches\n",
              sms, kThreads, kRows, kCols, kTiles, kTileRows, kReps);
  const float base_ns = run<kKernel>(sms, tiles, x, out, stamps, smem);
  const std::vector<float> base = rows_of();
  float scale = 0.0f;
  for (float v : base) scale = std::max(scale, std::fabs(v));
  std::printf("  %-10s %7.1f ns a 32-row tile\n", "kernel", base_ns);
  auto report = [&](const char* name, float ns) {
    const std::vector<float> v = rows_of();
    float worst = 0.0f;
    for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::fabs(v[i] - base[i]));
    std::printf("  %-10s %7.1f ns a 32-row tile (%.2fx), largest deviation from kernel's %.2e of its largest value\n",
                name, ns, base_ns / ns, worst / scale);
  };
  report("one-sync", run<kOneSync>(sms, tiles, x, out, stamps, smem));
  report("four-rows", run<kFourRows>(sms, tiles, x, out, stamps, smem));
  report("one-level", run<kOneLevel>(sms, tiles, x, out, stamps, smem));
  report("mma", tile_ns(mma_kernel, sms, tiles, x, out, stamps, sizeof(MmaSmem)));
  const std::vector<float> mma_rows = rows_of();
  constexpr int kRing = kChunks * 16, kPadded = kRing + 16;
  report("mma2", tile_ns(mma2_kernel<kRing, false>, sms, tiles, x, out, stamps, sizeof(Mma2Smem<kRing>)));
  const std::vector<float> mma2_rows = rows_of();
  report("mma2-sync", tile_ns(mma2_kernel<kRing, true>, sms, tiles, x, out, stamps, sizeof(Mma2Smem<kRing>)));
  report("mma2-pads", tile_ns(mma2_kernel<kPadded, true>, sms, tiles, x, out, stamps, sizeof(Mma2Smem<kPadded>)));
  report("mma2-2mask", tile_ns(mma2_kernel<kPadded, false, kTwoMasks>, sms, tiles, x, out, stamps,
                                sizeof(Mma2Smem<kPadded>)));
  report("mma2-1mma", tile_ns(mma2_kernel<kPadded, false, kOneMma>, sms, tiles, x, out, stamps,
                               sizeof(Mma2Smem<kPadded>)));
  report("mma2-pad", tile_ns(mma2_kernel<kPadded, false>, sms, tiles, x, out, stamps, sizeof(Mma2Smem<kPadded>)));
  // Both forms against the exact product of the same codes, scales and activations (fp64).
  std::vector<double> exact(kRows);
  for (int r = 0; r < kRows; ++r) {
    const uint8_t* p = host.data() + size_t(r / kTileRows) * kSlotBytes;
    const uint16_t* sb = reinterpret_cast<const uint16_t*>(p + kTileRows * kChunks * 16);
    const int tr = r % kTileRows;
    double acc = 0.0;
    for (int col = 0; col < kCols; ++col) {
      const uint8_t byte = p[(tr * kChunks + col / 32) * 16 + (col % 32) / 2];
      const int code = col % 2 ? byte >> 4 : byte & 15;
      auto f = [](uint16_t h) {
        const uint32_t u = uint32_t(h) << 16;
        float v;
        std::memcpy(&v, &u, 4);
        return double(v);
      };
      acc += (f(sb[tr * kGroups + col / kGroup]) * code + f(sb[kTileRows * kGroups + tr * kGroups + col / kGroup])) *
             double(hx[col]);
    }
    exact[r] = acc;
  }
  auto error = [&](const std::vector<float>& v) {
    double worst = 0.0;
    for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::fabs(double(v[i]) - exact[i % kRows]));
    return worst / double(scale);
  };
  std::printf("  largest error against the exact product, of the largest value: kernel %.2e, mma %.2e, mma2 %.2e, "
              "mma2-pad %.2e\n",
              error(base), error(mma_rows), error(mma2_rows), error(rows_of()));
  return 0;
}
