// The decode GEMV with its weights copied into shared memory (gemv_async_kernel in linear.cu), as
// pieces a kernel can run: one block's rows, their ring of tiles, and the dots. The MoE down kernel
// that also computes the next layer's input projections (moe.cu) runs the same pieces, so both
// produce the same values bit for bit.
//
// A block owns one contiguous range of rows and copies them (weights, scales, biases) through a
// ring of kAsyncStages tiles with cp.async; the GEMV kernel issues the first tiles before it waits
// for the kernel that writes x, so its weights are in flight while its predecessor still runs. One
// block of 512 threads per multiprocessor with a 192 KB ring: a layer's input projections are in
// flight whole (a 96 KB ring, which would leave room for the next kernel's block, measured
// slower). Tiles whose rows are dotted free their slot for the range's next tile. A ring has no
// more slots than a block has tiles (an output projection's 16 rows a block need one), with
// kOneBlockPerSmSmem in all as the floor for a grid of one wave (one block an SM). Whether the next
// kernel's block can start beside it is then up to the registers: two 16-warp blocks of ~100
// registers fill the register file.
#pragma once
#include "backend/cuda/gemv.cuh"

#include <algorithm>

namespace petrel::cuda {

constexpr int kAsyncWarps = 16;
constexpr int kAsyncStages = 4;
constexpr size_t kAsyncRingBytes = 192 * 1024;

// The matrix of a multi-matrix GEMV launch that block `block` works on, and its place in it.
struct BlockSegment {
  DeviceMatrix w;
  GemvOut out;
  int block = 0, blocks = 0, rows_per_block = 0;
};
__device__ __forceinline__ BlockSegment block_segment(const GemvSegments& segs, int block) {
  BlockSegment b;
#pragma unroll
  for (int i = 0; i < GemvSegments::kMax; ++i)  // constant indices keep the segments in parameter space
    if (i < segs.n && block >= segs.first_block[i] && block < segs.first_block[i + 1]) {
      b.w = segs.w[i];
      b.out = segs.out[i];
      b.block = block - segs.first_block[i];
      b.blocks = segs.first_block[i + 1] - segs.first_block[i];
      b.rows_per_block = segs.rows_per_block[i];
    }
  return b;
}

// Rows [0, rows) of tile a dotted with one activation row held in registers (xr, scaled by
// `scale`): a warp per row, two rows at a time. Where keep is set, row r's stored value also goes
// to keep[r].
template <WFormat F, int CPL>
__device__ void tile_rows_x1(const AsyncTile<F>& a, const ChunkMatrix<F>& m, int rows, const ChunkX<F> (&xr)[CPL],
                             float scale, const GemvOut& out, int first, float* keep) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int row = warp; row < rows; row += 2 * kAsyncWarps) {  // uniform per warp: shuffles are safe
    const int row2 = row + kAsyncWarps;
    const float v = warp_sum(row_dot_x1(a, m, row, xr)), v2 = row2 < rows ? warp_sum(row_dot_x1(a, m, row2, xr)) : 0.0f;
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

// Rows [0, rows) of tile a dotted with T staged activation rows, lpr lanes per row; keep as in
// tile_rows_x1 (activation row 0).
template <WFormat F, int TMAX>
__device__ void tile_rows_staged(const AsyncTile<F>& a, const ChunkMatrix<F>& m, int rows, const Staged<F>& st, int T,
                                 int lpr, const GemvOut& out, int first, float* keep) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane / lpr, sl = lane % lpr, pass = 32 / lpr;
  for (int base = warp * pass; base < rows; base += kAsyncWarps * pass) {  // uniform per warp: shuffles are safe
    const int row = base + sub;
    float acc[TMAX] = {};
    if (row < rows)
      for (int c = sl; c < m.chunks; c += lpr) {
        const Chunk ch = a.load(m, row, c);
#pragma unroll
        for (int t = 0; t < TMAX; ++t)
          if (t < T) acc[t] += st.dot(ch, t, c);
      }
#pragma unroll
    for (int t = 0; t < TMAX; ++t) {
      const float v = group_sum(acc[t], lpr);
      if (t < T && sl == 0 && row < rows) {
        const float stored = write_out(out, t * out.stride + first + row, v * st.row_scale(t));
        if (keep && t == 0) keep[row] = stored;
      }
    }
  }
}

// One block's share of an async GEMV launch: its rows of one segment, their ring of tiles at
// `ring`, and the dots once the activations are staged.
template <WFormat F>
struct AsyncGemvBlock {
  BlockSegment seg;
  ChunkMatrix<F> m;
  int r0 = 0, r1 = 0, tiles = 0, tile_rows = 0, slot_bytes = 0;
  char* ring = nullptr;

  __device__ AsyncGemvBlock(const GemvSegments& segs, int block, char* ring_at, int rows_a_tile)
      : seg(block_segment(segs, block)), m(chunk_matrix<F>(seg.w)), tile_rows(rows_a_tile), ring(ring_at) {
    r0 = seg.block * seg.rows_per_block;
    r1 = min(seg.w.rows, r0 + seg.rows_per_block);
    tiles = div_up(r1 - r0, tile_rows);
    slot_bytes = tile_rows * async_row_bytes(m.chunks, m.groups);
  }
  __device__ AsyncTile<F> slot(int tile) const {
    return AsyncTile<F>::at(ring + (tile % kAsyncStages) * slot_bytes, tile_rows, m);
  }
  // Whole block: one copy group per tile, empty past the range's end, so that the wait count stays fixed.
  __device__ void issue(int tile) const {
    if (tile < tiles) {
      const int first = r0 + tile * tile_rows, rows = min(tile_rows, r1 - first);
      copy_rows_async(slot(tile), m, first, rows);
    }
    cp_async_commit();
  }
  // Whole block: the ring's first tiles.
  __device__ void issue_ring() const {
#pragma unroll
    for (int i = 0; i < kAsyncStages; ++i) issue(i);
  }
  // Whole block, after issue_ring: each tile dotted with the staged activations as it lands (CPL >
  // 0: one row held in registers, CPL·32 chunks wide), its slot then taking the tile kAsyncStages on.
  template <int TMAX, int CPL>
  __device__ void dot_tiles(const Staged<F>& st, int T, int lpr, float* keep) const {
    ChunkX<F> xr[CPL > 0 ? CPL : 1];
    if constexpr (CPL > 0) load_lane_x(st, xr);
    const float scale = st.row_scale(0);
    for (int tile = 0; tile < tiles; ++tile) {
      cp_async_wait<kAsyncStages - 1>();
      __syncthreads();  // every thread's copies of this tile have landed
      const int first = r0 + tile * tile_rows, rows = min(tile_rows, r1 - first);
      float* tile_keep = keep ? keep + (first - r0) : nullptr;
      if constexpr (CPL > 0) tile_rows_x1<F, CPL>(slot(tile), m, rows, xr, scale, seg.out, first, tile_keep);
      else tile_rows_staged<F, TMAX>(slot(tile), m, rows, st, T, lpr, seg.out, first, tile_keep);
      __syncthreads();  // the slot is read: the tile kAsyncStages on may take it
      issue(tile + kAsyncStages);
    }
  }
};

// Rows a tile holds (a multiple of async_row_align), 0 where not even that many fit a ring slot.
inline int async_tile_rows(const DeviceMatrix& w) {
  const int align = async_row_align(w), rows = int(kAsyncRingBytes / kAsyncStages) / async_row_bytes(w);
  return rows - rows % align;
}

// The async GEMV takes segments whose rows share one layout (tiles are sized for the first) and
// whose data starts 16-byte aligned, with up to 16 KB of staged activations.
template <WFormat F>
bool gemv_async_fits(const GemvSegments& segs, int T) {
  for (int i = 0; i < segs.n; ++i) {
    const DeviceMatrix& w = segs.w[i];
    if (reinterpret_cast<uintptr_t>(w.w) % 16 || reinterpret_cast<uintptr_t>(w.scales) % 16 ||
        reinterpret_cast<uintptr_t>(w.biases) % 16 || (F != WFormat::BF16 && w.group != segs.w[0].group))
      return false;
  }
  return async_tile_rows(segs.w[0]) > 0 &&
         staged_bytes(F, segs.w[0].cols, T) <= 16 * 1024;
}

// How an async GEMV launch covers its rows: blocks, tiles, ring slots and the shared memory a
// block needs (ring, staged activations and, with the router's sums, their columns and kept rows).
struct AsyncPlan {
  int blocks = 0, tile_rows = 0, ring_slots = 0, lpr = 0;
  size_t smem = 0;
};

// Sets segs' block ranges (blocks in proportion to rows, one per multiprocessor in all, segs.leave
// of them left free) and plans the ring for T activation rows (CPL: as gemv_async_kernel).
template <WFormat F, int CPL>
AsyncPlan plan_gemv_async(GemvSegments& segs, int T) {
  const DeviceMatrix& w0 = segs.w[0];
  const int align = async_row_align(w0);
  int64_t total = 0;
  for (int i = 0; i < segs.n; ++i) total += segs.w[i].rows;
  segs.first_block[0] = 0;
  const int spare = std::max(0, sm_count() - segs.leave - segs.n);
  for (int i = 0; i < segs.n; ++i) {
    const int rows = segs.w[i].rows;
    const int want = 1 + int(spare * rows / total);
    const int per = div_up(div_up(rows, want), align) * align;
    segs.rows_per_block[i] = per;
    segs.first_block[i + 1] = segs.first_block[i] + div_up(rows, per);
  }
  // One activation row: where a block's rows fit the ring in tiles of whole two-row passes (a warp
  // dots two rows at a time), every warp dots as many rows as the others (45-row tiles left 13 of
  // the 16 warps a third row).
  int per_max = 0;
  for (int i = 0; i < segs.n; ++i) per_max = std::max(per_max, segs.rows_per_block[i]);
  AsyncPlan p;
  p.blocks = segs.first_block[segs.n];
  const int most = async_tile_rows(w0), pass = 2 * kAsyncWarps;
  const int even = div_up(div_up(per_max, kAsyncStages), pass) * pass;
  p.tile_rows = CPL > 0 && even <= most ? even : most;
  p.ring_slots = std::min(kAsyncStages, div_up(per_max, p.tile_rows));  // no block has more tiles
  p.lpr = lanes_per_row(w0.cols / chunk_weights(F));
  p.smem = size_t(p.ring_slots) * p.tile_rows * async_row_bytes(w0) + staged_bytes(F, w0.cols, T);
  if (segs.route.sums) {  // the block's rows of the route's columns, then their values of h
    segs.route.smem_at = div_up(int64_t(p.smem), 16) * 16;
    p.smem = segs.route.smem_at + size_t(per_max) * (segs.route.ld * 2 + 4);
  }
  return p;
}

}  // namespace petrel::cuda
