// y = x · Wᵀ for every weight format: a GEMV for a few rows (decode), tensor cores reading each
// weight once for a batched step's rows (linear_rows.cu), the tensor-core GEMM (gemm.cu) for many
// rows (prefill), and its grouped form for MoE.
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {
namespace {

constexpr int kGemvWarps = 8;
constexpr int kGemvChunksInFlight = 8;  // 16-byte weight loads each lane keeps in flight
constexpr int kGemvBlocksPerSm = 3;     // registers allow 3 blocks per multiprocessor: grids stay one wave
constexpr int kStagedGemvMaxTokens = 4;
constexpr size_t kStagedGemvMaxSmem = 96 * 1024;

// The matrix of a multi-matrix GEMV launch that this block works on, and the block's place in it.
struct BlockSegment {
  DeviceMatrix w;
  GemvOut out;
  int block = 0, blocks = 0, rows_per_block = 0;
};
__device__ __forceinline__ BlockSegment block_segment(const GemvSegments& segs) {
  BlockSegment b;
#pragma unroll
  for (int i = 0; i < GemvSegments::kMax; ++i)  // constant indices keep the segments in parameter space
    if (i < segs.n && int(blockIdx.x) >= segs.first_block[i] && int(blockIdx.x) < segs.first_block[i + 1]) {
      b.w = segs.w[i];
      b.out = segs.out[i];
      b.block = blockIdx.x - segs.first_block[i];
      b.blocks = segs.first_block[i + 1] - segs.first_block[i];
      b.rows_per_block = segs.rows_per_block[i];
    }
  return b;
}

// The register-streaming decode GEMV, for rows that gemv_async_kernel's tiles do not take (bf16
// rows wider than ~6K, segments of mixed group sizes): activations staged once per block, `lpr`
// lanes per row; each lane keeps 8 chunks in flight: NR rows x (8 / NR) consecutive chunk steps.
// Several matrices sharing the input (a layer's projections) run in one launch, each over its own
// range of blocks, which stride over its rows. Launched with PDL: a block loads its first chunks before it waits for
// the kernel that writes x, and asks L2 for its next rows at the start of each pass. A staged
// norm (the layer's input RMSNorm) and an added output (the residual update) cost no launch.
template <WFormat F, int TMAX, int NR>
__global__ void __launch_bounds__(32 * kGemvWarps, kGemvBlocksPerSm)
    gemv_staged_kernel(GemvSegments segs, const void* x, int64_t x_stride, int x_elem, int T, int lpr, StageNorm norm) {
  constexpr int U = kGemvChunksInFlight / NR;
  pdl_launch_dependents();
  const BlockSegment seg = block_segment(segs);
  const DeviceMatrix& w = seg.w;
  const GemvOut& out = seg.out;
  const int block = seg.block, blocks = seg.blocks;
  const ChunkMatrix<F> m = chunk_matrix<F>(w);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / lpr, sl = lane % lpr, pass = 32 / lpr;
  const int warp_rows = NR * pass, block_rows = kGemvWarps * warp_rows;
  const int64_t stride_rows = int64_t(blocks) * block_rows, first_row = int64_t(block) * block_rows;
  Chunk ch[NR][U];
  auto load_step = [&](int64_t base, int c0) {
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t row = base + r * pass + sub;
        if (row < w.rows && c0 + u * lpr < m.chunks) ch[r][u] = m.load(row, c0 + u * lpr);
      }
  };
  load_step(first_row + warp * warp_rows, sl);  // weights: loaded before waiting for x
  pdl_wait();
  extern __shared__ float4 smem4[];
  const Staged<F> st = stage_rows<F>(reinterpret_cast<float*>(smem4), x, x_elem, w.cols, T,
                                     [&](int t) { return t * x_stride; }, norm);
  bool loaded = true;
  for (int64_t first = first_row; first < w.rows; first += stride_rows) {
    if (threadIdx.x == 0) m.prefetch_rows(first + stride_rows, std::min<int64_t>(w.rows, first + stride_rows + block_rows));
    const int64_t base = first + warp * warp_rows;
    float acc[NR][TMAX] = {};
    for (int c0 = sl; c0 < m.chunks; c0 += lpr * U) {
      if (!loaded) load_step(base, c0);
      loaded = false;
#pragma unroll
      for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int t = 0; t < TMAX; ++t)
            if (t < T && c0 + u * lpr < m.chunks) acc[r][t] += st.dot(ch[r][u], t, c0 + u * lpr);
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const int64_t row = base + r * pass + sub;
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        const float v = group_sum(acc[r][t], lpr);
        if (t < T && sl == 0 && row < w.rows) write_out(out, t * out.stride + row, v * st.row_scale(t));
      }
    }
  }
}

template <WFormat F, int TMAX, int NR>
void launch_gemv_staged(GemvSegments segs, const void* x, int64_t x_stride, int x_elem, int T, size_t smem, int lpr,
                        StageNorm norm, cudaStream_t s) {
  allow_dynamic_smem<gemv_staged_kernel<F, TMAX, NR>>(kStagedGemvMaxSmem);
  const int block_rows = kGemvWarps * NR * (32 / lpr);
  segs.first_block[0] = 0;
  for (int i = 0; i < segs.n; ++i)
    segs.first_block[i + 1] = segs.first_block[i] + std::min(div_up(segs.w[i].rows, block_rows), sm_count() * kGemvBlocksPerSm);
  launch_pdl(gemv_staged_kernel<F, TMAX, NR>, segs.first_block[segs.n], 32 * kGemvWarps, smem, s, segs, x, x_stride,
             x_elem, T, lpr, norm);
}

// Rows in flight per warp: as many as keep at least two blocks per multiprocessor busy.
template <WFormat F, int TMAX>
void gemv_staged_rows(const GemvSegments& segs, const void* x, int64_t x_stride, int x_elem, int T, size_t smem,
                      StageNorm norm, cudaStream_t s) {
  const int lpr = lanes_per_row(segs.w[0].cols / chunk_weights(F)), pass = 32 / lpr;
  int64_t rows = 0;
  for (int i = 0; i < segs.n; ++i) rows += segs.w[i].rows;
  auto enough = [&](int nr) { return div_up(rows, kGemvWarps * nr * pass) >= 2 * sm_count(); };
  if (enough(4)) launch_gemv_staged<F, TMAX, 4>(segs, x, x_stride, x_elem, T, smem, lpr, norm, s);
  else if (enough(2)) launch_gemv_staged<F, TMAX, 2>(segs, x, x_stride, x_elem, T, smem, lpr, norm, s);
  else launch_gemv_staged<F, TMAX, 1>(segs, x, x_stride, x_elem, T, smem, lpr, norm, s);
}

// The decode GEMV with its weights copied into shared memory. A block owns one contiguous range
// of rows and copies them (weights, scales, biases) through a ring of kAsyncStages tiles with
// cp.async, the first tiles before it waits for the kernel that writes x: a kernel's weights are
// in flight while its predecessor still runs. One block of 512 threads per multiprocessor with a
// 192 KB ring: a layer's input projections are in flight whole (a 96 KB ring, which would leave
// room for the next kernel's block, measured slower). Tiles whose rows are dotted free their slot
// for the range's next tile. A ring has no more slots than a block has tiles (an output
// projection's 16 rows a block need one), with kOneBlockPerSmSmem in all as the floor for a grid
// of one wave (one block an SM). Whether the next kernel's block can start beside it is then up
// to the registers: two 16-warp blocks of ~100 registers fill the register file.
constexpr int kAsyncStages = 4;
constexpr int kPreWaitTiles = 1;  // of the ring's first kAsyncStages tiles, those issued before the wait
constexpr size_t kAsyncRingBytes = 192 * 1024;

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

// What a one-row block does once its rows are written, from their values kept in shared memory:
// segs.route's router sums, or segs.argmax's candidate (a template parameter: the other launches
// keep their registers).
enum class GemvEpilogue { None, RouteSums, Argmax };

// CPL > 0: one activation row whose row width is CPL·32 chunks, held in registers (the batch-1
// decode step); CPL = 0: up to TMAX rows read from shared memory.
template <WFormat F, int TMAX, int CPL, GemvEpilogue E>
__global__ void __launch_bounds__(32 * kAsyncWarps, 1)
    gemv_async_kernel(GemvSegments segs, const void* x, int64_t x_stride, int x_elem, int T, int lpr, int tile_rows,
                      int ring_slots, StageNorm norm) {
  pdl_launch_dependents();
  const BlockSegment seg = block_segment(segs);  // its rows: [r0, r1) of seg.w
  const ChunkMatrix<F> m = chunk_matrix<F>(seg.w);
  const int r0 = seg.block * seg.rows_per_block, r1 = min(seg.w.rows, r0 + seg.rows_per_block);
  const int tiles = div_up(r1 - r0, tile_rows);
  const int slot_bytes = tile_rows * async_row_bytes(m.chunks, m.groups);
  extern __shared__ float4 smem4[];
  char* ring = reinterpret_cast<char*>(smem4);
  auto slot = [&](int tile) { return AsyncTile<F>::at(ring + (tile % kAsyncStages) * slot_bytes, tile_rows, m); };
  // One copy group per tile, empty past the range's end, so that the wait count stays fixed.
  auto issue = [&](int tile) {
    if (tile < tiles) {
      const int first = r0 + tile * tile_rows, rows = min(tile_rows, r1 - first);
      copy_rows_async(slot(tile), m, first, rows);
    }
    cp_async_commit();
  };
  // With the router's sums: the block's rows of their columns join the first tile's copies.
  const RouteSums& route = segs.route;
  const bf16* route_cols = reinterpret_cast<const bf16*>(ring + route.smem_at);
  float* keep = nullptr;
  if constexpr (E == GemvEpilogue::RouteSums) {
    copy_async(route_cols, route.cols + int64_t(r0) * route.ld, (r1 - r0) * route.ld * 2);
    keep = reinterpret_cast<float*>(ring + route.smem_at + seg.rows_per_block * route.ld * 2);
  } else if constexpr (E == GemvEpilogue::Argmax) {
    keep = reinterpret_cast<float*>(ring + segs.argmax.smem_at);
  }
  const auto epilogue = [&] {  // whole block, once every warp's rows are in keep
    if constexpr (E == GemvEpilogue::RouteSums) add_route_sums(route, route_cols, keep, r1 - r0);
    else if constexpr (E == GemvEpilogue::Argmax) leave_argmax_candidate(segs.argmax, keep, r0, r1 - r0, seg.w.rows);
  };
  // The first tiles go out before waiting for x; x's loads go out before the rest (they would
  // queue behind them), while those tiles land.
#pragma unroll
  for (int i = 0; i < kPreWaitTiles; ++i) issue(i);
  const auto x_row = [&](int t) { return t * x_stride; };
  float* staged = reinterpret_cast<float*>(ring + ring_slots * slot_bytes);
  // A block below segs.warm_blocks (one register-held row, CPL > 0) starts while the kernel before
  // still runs: it first runs the code below once on stand-in inputs (its own weight rows as x, the
  // tiles as they land) and stores nothing, so that after the wait its instructions are cached (a
  // decode kernel's code is otherwise fetched cold after its wait). One loop body for both passes
  // keeps them the same instructions. Blocks that start late skip it: it would delay them. The
  // output projections (4,096 columns: CPL 4) take the ring path below, so its stand-in pass
  // matters (without it decode measured 1.0-1.4% slower).
#pragma unroll 1
  for (int pass = CPL > 0 && int(blockIdx.x) < segs.warm_blocks ? 0 : 1; pass < 2; ++pass) {
    const bool real = pass == 1;
    if (real) pdl_wait();
    const void* xin = real ? x : static_cast<const void*>(seg.w.w);  // never x before the wait: no stale lines
    const StageInputs ahead = stage_ahead<F>(xin, x_elem, seg.w.cols, T, x_row, norm);
    if (real) {
#pragma unroll
      for (int i = kPreWaitTiles; i < kAsyncStages; ++i) issue(i);
    }
    const Staged<F> st = stage_rows<F>(staged, xin, x_elem, seg.w.cols, T, x_row, norm, ahead);
    ChunkX<F> xr[CPL > 0 ? CPL : 1];
    if constexpr (CPL > 0) load_lane_x(st, xr);
    const float scale = st.row_scale(0);
    if constexpr (CPL > 0 && CPL <= 2) {
      if (tiles <= kAsyncStages) {  // every tile in flight at once: no slot refills, the dots take tiles in pairs
        for (int tile = 0; tile < tiles; tile += 2) {
          if (real) cp_async_wait<kAsyncStages - 2>();
          __syncthreads();  // every thread's copies of the two tiles have landed
          const int first = r0 + tile * tile_rows, rows = min(2 * tile_rows, r1 - first);
          tile_pair_rows_x1<F, CPL>(slot(tile), slot(tile + 1), tile_rows, m, rows, xr, scale, seg.out, first,
                                    keep ? keep + (first - r0) : nullptr, real);
          if (real) {
            cp_async_commit();  // two empty groups for the two tiles taken, as the loop below commits
            cp_async_commit();
          }
        }
        if (!real) {
          __syncthreads();  // the stand-in pass has read the staged rows before the real one writes them
          continue;
        }
        if constexpr (E != GemvEpilogue::None) {
          __syncthreads();  // every warp's rows are in keep
          epilogue();
        }
        return;
      }
    }
    for (int tile = 0; tile < (real ? tiles : min(tiles, 2)); ++tile) {
      if (real) cp_async_wait<kAsyncStages - 1>();
      __syncthreads();  // every thread's copies of this tile have landed
      const int first = r0 + tile * tile_rows, rows = min(tile_rows, r1 - first);
      float* tile_keep = keep ? keep + (first - r0) : nullptr;
      if constexpr (CPL > 0 && CPL <= 2)  // the four-row dots over one tile (the LM head's ring)
        tile_pair_rows_x1<F, CPL>(slot(tile), slot(tile), rows, m, rows, xr, scale, seg.out, first, tile_keep, real);
      else if constexpr (CPL > 0) tile_rows_x1<F, CPL>(slot(tile), m, rows, xr, scale, seg.out, first, tile_keep, real);
      else tile_rows_staged<F, TMAX>(slot(tile), m, rows, st, T, lpr, seg.out, first, tile_keep);
      __syncthreads();  // the slot is read: the tile kAsyncStages on may take it
      if (real) issue(tile + kAsyncStages);
    }
    if (real) epilogue();
  }
}

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

// Launches the blocks of segs and returns how many.
template <WFormat F, int TMAX, int CPL>
int launch_gemv_async(GemvSegments segs, const void* x, int64_t x_stride, int x_elem, int T, StageNorm norm,
                      cudaStream_t s) {
  const DeviceMatrix& w0 = segs.w[0];
  const int align = async_row_align(w0);
  int64_t total = 0;
  for (int i = 0; i < segs.n; ++i) total += segs.w[i].rows;
  segs.first_block[0] = 0;
  const int spare = std::max(0, sm_count() - segs.leave - segs.n);
  for (int i = 0; i < segs.n; ++i) {  // blocks in proportion to rows, one per multiprocessor in all
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
  const int most = async_tile_rows(w0), pass = 2 * kAsyncWarps;
  const int even = div_up(div_up(per_max, kAsyncStages), pass) * pass;
  const int tile_rows = CPL > 0 && even <= most ? even : most;
  const int ring_slots = std::min(kAsyncStages, div_up(per_max, tile_rows));  // no block has more tiles
  size_t smem = size_t(ring_slots) * tile_rows * async_row_bytes(w0) + staged_bytes(F, w0.cols, T);
  if (segs.route.sums) {  // the block's rows of the route's columns, then their values of h
    segs.route.smem_at = div_up(int64_t(smem), 16) * 16;
    smem = segs.route.smem_at + size_t(per_max) * (segs.route.ld * 2 + 4);
  }
  if (segs.argmax.v) {  // the values of the block's rows
    segs.argmax.smem_at = div_up(int64_t(smem), 16) * 16;
    smem = segs.argmax.smem_at + size_t(per_max) * 4;
  }
  if (segs.first_block[segs.n] <= sm_count()) smem = std::max(smem, kOneBlockPerSmSmem);
  const int lpr = lanes_per_row(segs.w[0].cols / chunk_weights(F)), blocks = segs.first_block[segs.n];
  const auto launch = [&](auto kernel) {
    launch_pdl(kernel, blocks, 32 * kAsyncWarps, smem, s, segs, x, x_stride, x_elem, T, lpr, tile_rows, ring_slots,
               norm);
    return blocks;
  };
  if constexpr (TMAX == 1) {
    if (segs.route.sums) {
      allow_dynamic_smem<gemv_async_kernel<F, TMAX, CPL, GemvEpilogue::RouteSums>>(smem);
      return launch(gemv_async_kernel<F, TMAX, CPL, GemvEpilogue::RouteSums>);
    }
    if (segs.argmax.v) {
      allow_dynamic_smem<gemv_async_kernel<F, TMAX, CPL, GemvEpilogue::Argmax>>(smem);
      return launch(gemv_async_kernel<F, TMAX, CPL, GemvEpilogue::Argmax>);
    }
  }
  check(!segs.route.sums && !segs.argmax.v, "CUDA GEMV: router sums and argmax candidates need one-row launches");
  allow_dynamic_smem<gemv_async_kernel<F, TMAX, CPL, GemvEpilogue::None>>(smem);
  return launch(gemv_async_kernel<F, TMAX, CPL, GemvEpilogue::None>);
}

// Returns the blocks launched.
template <WFormat F>
int gemv_async(const GemvSegments& segs, const void* x, int64_t x_stride, int x_elem, int T, StageNorm norm,
               cudaStream_t s) {
  switch (T == 1 ? lane_x_chunks(F, segs.w[0].cols / chunk_weights(F)) : 0) {
    case 1: return launch_gemv_async<F, 1, 1>(segs, x, x_stride, x_elem, T, norm, s);
    case 2: return launch_gemv_async<F, 1, 2>(segs, x, x_stride, x_elem, T, norm, s);
    case 4: return launch_gemv_async<F, 1, 4>(segs, x, x_stride, x_elem, T, norm, s);
    case 8:
      if constexpr (max_lane_chunks(F) >= 8) return launch_gemv_async<F, 1, 8>(segs, x, x_stride, x_elem, T, norm, s);
  }
  if (T == 1) return launch_gemv_async<F, 1, 0>(segs, x, x_stride, x_elem, T, norm, s);
  if (T == 2) return launch_gemv_async<F, 2, 0>(segs, x, x_stride, x_elem, T, norm, s);
  return launch_gemv_async<F, 4, 0>(segs, x, x_stride, x_elem, T, norm, s);
}

template <WFormat F>
void gemv_staged(const GemvSegments& segs, const void* x, int64_t x_stride, int x_elem, int T, StageNorm norm,
                 cudaStream_t s) {
  const size_t smem = staged_bytes(F, segs.w[0].cols, T);
  if (gemv_async_fits<F>(segs, T)) {
    gemv_async<F>(segs, x, x_stride, x_elem, T, norm, s);
    return;
  }
  if (T == 1) gemv_staged_rows<F, 1>(segs, x, x_stride, x_elem, T, smem, norm, s);
  else if (T == 2) gemv_staged_rows<F, 2>(segs, x, x_stride, x_elem, T, smem, norm, s);
  else gemv_staged_rows<F, 4>(segs, x, x_stride, x_elem, T, smem, norm, s);
}

void gemv_staged(const GemvSegments& segs, const void* x, int64_t x_stride, int x_elem, int T, StageNorm norm,
                 cudaStream_t s) {
  switch (segs.w[0].format) {
    case WFormat::Q4: return gemv_staged<WFormat::Q4>(segs, x, x_stride, x_elem, T, norm, s);
    case WFormat::Q8: return gemv_staged<WFormat::Q8>(segs, x, x_stride, x_elem, T, norm, s);
    case WFormat::F8: return gemv_staged<WFormat::F8>(segs, x, x_stride, x_elem, T, norm, s);
    case WFormat::I4: return gemv_staged<WFormat::I4>(segs, x, x_stride, x_elem, T, norm, s);
    case WFormat::BF16: return gemv_staged<WFormat::BF16>(segs, x, x_stride, x_elem, T, norm, s);
  }
}

// Staging takes up to 4 activation rows that fit in shared memory.
bool gemv_staged_fits(const DeviceMatrix& w, int T) {
  return T <= kStagedGemvMaxTokens && chunked_layout(w) && staged_bytes(w.format, w.cols, T) <= kStagedGemvMaxSmem;
}

// The general fallback (odd shapes, up to 8 tokens): one warp per output row; lanes stride over 8-column chunks so each warp load is coalesced.
template <int TMAX>
__global__ void gemv_kernel(DeviceMatrix w, const void* x, int64_t x_stride, int x_elem, int T, void* y,
                            int64_t y_stride, int y_elem) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kGemvWarps + warp;
  if (row >= w.rows) return;
  float acc[TMAX];
#pragma unroll
  for (int t = 0; t < TMAX; ++t) acc[t] = 0.0f;
  if (q4_wide(w)) {
    // 16-byte weight loads: each lane streams 32 weights per step.
    for (int c32 = lane; c32 < w.cols / 32; c32 += 32) {
      uint32_t words[4];
      float sc, bi;
      load32_q4(w, row, c32, words, &sc, &bi);
#pragma unroll
      for (int t = 0; t < TMAX; ++t)
        if (t < T) acc[t] += dot32_q4(words, sc, bi, x, x_elem, t * x_stride + int64_t(c32) * 32);
    }
  } else {
    for (int c8 = lane; c8 < w.cols / 8; c8 += 32) {
      float wv[8];
      load8(w, row, c8, wv);
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        if (t < T) {
          float xv[8];
          load8_x(x, x_elem, t * x_stride + c8 * 8, xv);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[t] += wv[i] * xv[i];
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < TMAX; ++t) {
    if (t < T) {
      const float s = warp_sum(acc[t]);
      if (lane == 0) store_act(y, y_elem, t * y_stride + row, s);
    }
  }
}

void check_shapes(const DeviceMatrix& w, int64_t x_stride) {
  check(w.cols % 8 == 0, "CUDA linear: input width " + std::to_string(w.cols) + " is not a multiple of 8");
  check(x_stride % 8 == 0, "CUDA linear: activation row stride must be a multiple of 8 elements");
}

// grid (ceil(n/256), T): one element per thread.
__global__ void round_kernel(const float* x, int64_t x_stride, int n, bf16* out, int64_t out_stride) {
  pdl_enter();
  const int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
  if (i < n) out[t * out_stride + i] = __float2bfloat16(x[t * x_stride + i]);
}

}  // namespace

int loaded_ptx_version() {
  static const int v = [] {
    cudaFuncAttributes fa = {};
    PETREL_CUDA(cudaFuncGetAttributes(&fa, round_kernel));
    return fa.ptxVersion;
  }();
  return v;
}

int sm_count() {
  static const int n = [] {
    int device = 0, count = 0;
    PETREL_CUDA(cudaGetDevice(&device));
    PETREL_CUDA(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }();
  return n;
}

void round_to_bf16(const float* x, int64_t x_stride, int T, int n, bf16* out, int64_t out_stride, cudaStream_t s) {
  launch_pdl(round_kernel, dim3(div_up(n, 256), T), dim3(256), 0, s, x, x_stride, n, out, out_stride);
  PETREL_LAUNCHED("round_to_bf16");
}

void linear(const DeviceMatrix& w, const void* x, int64_t x_stride, int x_elem, int T, void* y, int64_t y_stride,
            int y_elem, cudaStream_t s) {
  check_shapes(w, x_stride);
  if (gemv_staged_fits(w, T)) {
    GemvSegments segs;
    segs.add(w, {y, y_stride, y_elem});
    gemv_staged(segs, x, x_stride, x_elem, T, {}, s);
    PETREL_LAUNCHED("gemv");
    return;
  }
  if (T <= kRowsMaxTokens && linear_rows_fits(w)) {
    const DeviceMatrix* ws[] = {&w};
    const GemvOut outs[] = {{y, y_stride, y_elem}};
    return linear_rows(ws, outs, 1, x, x_stride, x_elem, T, s);
  }
  if (T <= kGemvMaxTokens) {
    const dim3 grid(div_up(w.rows, kGemvWarps)), block(32 * kGemvWarps);
    if (T == 1) gemv_kernel<1><<<grid, block, 0, s>>>(w, x, x_stride, x_elem, T, y, y_stride, y_elem);
    else if (T == 2) gemv_kernel<2><<<grid, block, 0, s>>>(w, x, x_stride, x_elem, T, y, y_stride, y_elem);
    else if (T <= 4) gemv_kernel<4><<<grid, block, 0, s>>>(w, x, x_stride, x_elem, T, y, y_stride, y_elem);
    else gemv_kernel<8><<<grid, block, 0, s>>>(w, x, x_stride, x_elem, T, y, y_stride, y_elem);
    PETREL_LAUNCHED("gemv");
    return;
  }
  gemm(w, x, x_stride, x_elem, T, nullptr, nullptr, y, y_stride, y_elem, s);
  PETREL_LAUNCHED("gemm");
}

// Runs of neighbouring matrices of one format and width: one launch each.
void staged_runs(const DeviceMatrix* const* ws, const GemvOut* outs, int n, const void* x, int64_t x_stride, int x_elem,
                 int T, StageNorm norm, cudaStream_t s, int leave = 0) {
  for (int i = 0; i < n;) {
    GemvSegments segs;
    for (int j = i; j < n && segs.n < GemvSegments::kMax && ws[j]->format == ws[i]->format && ws[j]->cols == ws[i]->cols;
         ++j)
      segs.add(*ws[j], outs[j]);
    if (i + segs.n == n) segs.leave = leave;
    check_shapes(*ws[i], x_stride);
    gemv_staged(segs, x, x_stride, x_elem, T, norm, s);
    PETREL_LAUNCHED("gemv (several matrices)");
    i += segs.n;
  }
}

void linear_many(const DeviceMatrix* const* ws, const GemvOut* outs, int n, const void* x, int64_t x_stride, int x_elem,
                 int T, cudaStream_t s) {
  // Runs of matrices the staged GEMV takes share launches, as do runs the rows kernel takes (a
  // batched step's); anything else goes alone.
  for (int i = 0; i < n;) {
    int j = i;
    while (j < n && gemv_staged_fits(*ws[j], T)) ++j;
    if (j > i) {
      staged_runs(ws + i, outs + i, j - i, x, x_stride, x_elem, T, {}, s);
      i = j;
      continue;
    }
    if (T <= kRowsMaxTokens) {
      while (j < n && j - i < kRowsMaxSegments && linear_rows_share(*ws[i], *ws[j])) ++j;
      if (j > i) {
        check_shapes(*ws[i], x_stride);
        linear_rows(ws + i, outs + i, j - i, x, x_stride, x_elem, T, s);
        i = j;
        continue;
      }
    }
    linear(*ws[i], x, x_stride, x_elem, T, outs[i].y, outs[i].stride, outs[i].elem, s);
    ++i;
  }
}

bool gemv_stageable(const DeviceMatrix* const* ws, int n, int T, int64_t x_stride, bool norm) {
  if (x_stride % 8 != 0 || (norm && !norm_stageable(ws[0]->cols, x_stride))) return false;
  for (int i = 0; i < n; ++i)
    if (!gemv_staged_fits(*ws[i], T) || ws[i]->cols != ws[0]->cols) return false;
  return true;
}

void linear_many_staged(const DeviceMatrix* const* ws, const GemvOut* outs, int n, const void* x, int64_t x_stride,
                        int x_elem, int T, StageNorm norm, cudaStream_t s, int leave) {
  check(gemv_stageable(ws, n, T, x_stride, norm.w != nullptr), "CUDA linear: the staged GEMV does not fit these matrices");
  staged_runs(ws, outs, n, x, x_stride, x_elem, T, norm, s, leave);
}

namespace {

// True where the one-token async GEMV takes w alone (input stride x_stride; norm: it stages a norm)
// with `row_bytes` more shared memory for each row of a block's range and `block_bytes` more a block.
bool gemv_one_row_fits(const DeviceMatrix& w, int64_t x_stride, bool norm, int row_bytes, int block_bytes) {
  const DeviceMatrix* m = &w;
  if (!gemv_stageable(&m, 1, 1, x_stride, norm)) return false;
  GemvSegments segs;
  segs.add(w, {});
  const bool async = w.format == WFormat::Q4   ? gemv_async_fits<WFormat::Q4>(segs, 1)
                     : w.format == WFormat::Q8 ? gemv_async_fits<WFormat::Q8>(segs, 1)
                     : w.format == WFormat::F8 ? gemv_async_fits<WFormat::F8>(segs, 1)
                     : w.format == WFormat::I4 ? gemv_async_fits<WFormat::I4>(segs, 1)
                                               : gemv_async_fits<WFormat::BF16>(segs, 1);
  if (!async) return false;
  const int align = async_row_align(w), per = div_up(div_up(w.rows, sm_count()), align) * align;
  return kAsyncRingBytes + staged_bytes(w.format, w.cols, 1) + 16 + size_t(per) * row_bytes + block_bytes <=
         227 * 1024;
}

// The one-token async GEMV of segs (gemv_one_row_fits): returns the blocks launched.
int gemv_async_x1(const GemvSegments& segs, const void* x, int64_t x_stride, int x_elem, StageNorm norm,
                  cudaStream_t s) {
  switch (segs.w[0].format) {
    case WFormat::Q4: return gemv_async<WFormat::Q4>(segs, x, x_stride, x_elem, 1, norm, s);
    case WFormat::Q8: return gemv_async<WFormat::Q8>(segs, x, x_stride, x_elem, 1, norm, s);
    case WFormat::F8: return gemv_async<WFormat::F8>(segs, x, x_stride, x_elem, 1, norm, s);
    case WFormat::I4: return gemv_async<WFormat::I4>(segs, x, x_stride, x_elem, 1, norm, s);
    default: return gemv_async<WFormat::BF16>(segs, x, x_stride, x_elem, 1, norm, s);
  }
}

}  // namespace

bool gemv_route_fits(const DeviceMatrix& w, int64_t x_stride, const RouteSums& route) {
  return route.ld % 8 == 0 && route.n <= route.ld &&
         gemv_one_row_fits(w, x_stride, /*norm=*/false, route.ld * 2 + 4, 0);
}

void linear_add_route(const DeviceMatrix& w, const GemvOut& out, const void* x, int64_t x_stride, int x_elem,
                      const RouteSums& route, int mixer_blocks, cudaStream_t s) {
  check(out.add && out.elem == 4 && gemv_route_fits(w, x_stride, route),
        "CUDA linear_add_route: needs an fp32 residual row and a matrix the one-token async GEMV takes");
  GemvSegments segs;
  segs.add(w, out);
  segs.route = route;
  segs.warm_blocks = mixer_blocks > 0 ? std::max(0, sm_count() - mixer_blocks) : 0;
  gemv_async_x1(segs, x, x_stride, x_elem, {}, s);
  PETREL_LAUNCHED("gemv + router sums");
}

int linear_argmax(const DeviceMatrix& w, const GemvOut& out, const void* x, int64_t x_stride, int x_elem,
                  StageNorm norm, const ArgmaxCandidates& cand, cudaStream_t s) {
  if (out.add || out.elem != 4 || sm_count() > kArgmaxCandidates ||
      !gemv_one_row_fits(w, x_stride, norm.w != nullptr, 4, kBlockArgmaxSmem))
    return 0;
  GemvSegments segs;
  segs.add(w, out);
  segs.argmax = cand;
  const int blocks = gemv_async_x1(segs, x, x_stride, x_elem, norm, s);
  PETREL_LAUNCHED("gemv + argmax candidates");
  return blocks;
}

void grouped_linear(const DeviceMatrix& w, const void* x, int64_t x_stride, int x_elem, const int* row_token,
                    const int* tile_expert, int max_rows, bf16* y, int64_t y_stride, cudaStream_t s) {
  check_shapes(w, x_stride);
  gemm(w, x, x_stride, x_elem, max_rows, row_token, tile_expert, y, y_stride, 2, s);
  PETREL_LAUNCHED("grouped gemm");
}

}  // namespace petrel::cuda
